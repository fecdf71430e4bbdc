"""Parallel layouts: TP / DP / EP / PP sizes, rank <-> coordinates, and the rank lists of each process group.

Ranks are laid out Megatron-style, tensor parallel fastest: ``rank = (pp * dp_size + dp) * tp_size + tp``.
Expert parallelism is carved out of data parallelism (``ep`` divides ``dp``): ``ep_rank = dp % ep`` and the
expert-data-parallel replica is ``dp // ep``, so the expert-model-parallel group (TP x EP) of the paper's
TP2EP2DP2 case is the whole 4-rank world. ``fsdp=True`` marks an update state whose weights are additionally sharded over the
ranks that would otherwise hold identical copies (ZeRO-3 / FSDP2 style dim-0 chunks, see ``rules.py``).
``vocab_multiple`` pads vocabulary-parallel parameters to a multiple of ``vocab_multiple * tp`` rows, as Megatron does
(``--make-vocab-size-divisible-by``, 128); 1 (the default) pads only to a multiple of ``tp``.
"""

from __future__ import annotations

from dataclasses import dataclass

GROUP_KINDS = ("tp", "dp", "ep", "expert_dp", "pp", "tp_ep", "stage", "tp_pp")


@dataclass(frozen=True)
class RankCoords:
    """Where one rank sits in a layout."""

    pp: int
    dp: int
    ep: int
    tp: int


@dataclass(frozen=True)
class ParallelLayout:
    """Sizes of the parallel dimensions of one model state (update or generation) over ``world_size`` ranks."""

    tp: int = 1
    dp: int = 1
    ep: int = 1
    pp: int = 1
    world_size: int | None = None  # None: tp * dp * pp; always set after construction
    fsdp: bool = False
    vocab_multiple: int = 1  # vocab-parallel rows padded to a multiple of vocab_multiple * tp (Megatron: 128)

    def __post_init__(self) -> None:
        for name in ("tp", "dp", "ep", "pp", "vocab_multiple"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ParallelLayout.{name} must be a positive int, got {value!r}")
        world = self.tp * self.dp * self.pp if self.world_size is None else self.world_size
        if not isinstance(world, int) or world < 1:
            raise ValueError(f"ParallelLayout.world_size must be a positive int, got {self.world_size!r}")
        for name in ("tp", "dp", "pp"):
            if world % getattr(self, name):
                raise ValueError(f"ParallelLayout.{name}={getattr(self, name)} does not divide world_size={world}")
        if self.tp * self.dp * self.pp != world:
            raise ValueError(f"ParallelLayout: tp*dp*pp = {self.tp}*{self.dp}*{self.pp} = "
                             f"{self.tp * self.dp * self.pp} != world_size={world}")
        if self.dp % self.ep:
            raise ValueError(f"ParallelLayout.ep={self.ep} does not divide dp={self.dp} (world_size={world}): "
                             "expert parallelism is carved out of data parallelism")
        object.__setattr__(self, "world_size", world)

    @classmethod
    def for_world(cls, world_size: int, tp: int = 1, ep: int = 1, pp: int = 1, fsdp: bool = False,
                  vocab_multiple: int = 1) -> ParallelLayout:
        """The layout with ``dp`` derived as ``world_size / (tp * pp)``; ValueError names a size that does not fit."""
        for name, value in (("tp", tp), ("pp", pp)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ParallelLayout.{name} must be a positive int, got {value!r}")
            if world_size % value:
                raise ValueError(f"ParallelLayout.{name}={value} does not divide world_size={world_size}")
        if world_size % (tp * pp):
            raise ValueError(f"ParallelLayout: tp*pp = {tp * pp} does not divide world_size={world_size}")
        return cls(tp=tp, dp=world_size // (tp * pp), ep=ep, pp=pp, world_size=world_size, fsdp=fsdp,
                   vocab_multiple=vocab_multiple)

    @property
    def size(self) -> int:
        """Number of ranks the layout spans."""
        assert self.world_size is not None
        return self.world_size

    def __str__(self) -> str:
        ep = f"EP{self.ep}" if self.ep > 1 else ""
        pp = f"PP{self.pp}" if self.pp > 1 else ""
        return f"TP{self.tp}{ep}DP{self.dp}{pp}{'-FSDP' if self.fsdp else ''}"

    # -- rank <-> coordinates -------------------------------------------------------------------------
    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is outside layout {self} of world_size={self.size}")

    def coords(self, rank: int) -> RankCoords:
        """(pp, dp, ep, tp) of ``rank``."""
        self._check_rank(rank)
        tp = rank % self.tp
        dp = (rank // self.tp) % self.dp
        pp = rank // (self.tp * self.dp)
        return RankCoords(pp=pp, dp=dp, ep=dp % self.ep, tp=tp)

    def rank_of(self, pp: int, dp: int, tp: int) -> int:
        """The rank at the given coordinates (ep is implied by dp)."""
        for name, value, size in (("pp", pp, self.pp), ("dp", dp, self.dp), ("tp", tp, self.tp)):
            if not 0 <= value < size:
                raise ValueError(f"{name}={value} is outside 0..{size - 1} in layout {self}")
        return (pp * self.dp + dp) * self.tp + tp

    # -- process groups -------------------------------------------------------------------------------
    def groups(self, kind: str) -> list[list[int]]:
        """Rank lists of every group of ``kind`` (one of GROUP_KINDS), each sorted, the list sorted."""
        if kind not in GROUP_KINDS:
            raise ValueError(f"unknown group kind {kind!r}; expected one of {GROUP_KINDS}")
        by_key: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.size):
            by_key.setdefault(self._group_key(kind, rank), []).append(rank)
        return sorted(by_key.values())

    def group_of(self, kind: str, rank: int) -> list[int]:
        """The ranks of ``rank``'s group of ``kind``."""
        self._check_rank(rank)
        key = self._group_key(kind, rank)
        return [r for r in range(self.size) if self._group_key(kind, r) == key]

    def _group_key(self, kind: str, rank: int) -> tuple[int, ...]:
        """Ranks with equal keys share the group: the key is the coordinates that stay fixed inside it."""
        c = self.coords(rank)
        edp = c.dp // self.ep
        keys = {
            "tp": (c.pp, c.dp),
            "dp": (c.pp, c.tp),
            "ep": (c.pp, edp, c.tp),
            "expert_dp": (c.pp, c.ep, c.tp),
            "pp": (c.dp, c.tp),
            "tp_ep": (c.pp, edp),  # expert-model-parallel group: TP x EP, one full copy of the experts
            "stage": (c.pp,),  # every rank of one pipeline stage (TP x DP)
            "tp_pp": (c.dp,),  # model-parallel group (TP x PP): one full copy of a pipelined model
        }
        if kind not in keys:
            raise ValueError(f"unknown group kind {kind!r}; expected one of {GROUP_KINDS}")
        return keys[kind]
