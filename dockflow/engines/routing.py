"""Routing replay ("R3") for mixture-of-experts policies: the generating engine records which experts each token's
router chose, and the trainer's forward uses those experts instead of its own top-k.

An MoE router picks the top-k experts of each token from its logits; the trainer's numerics (batch shape, no KV
cache, padding, packing) differ from the generating engine's, so near-ties go the other way and the trainer scores
the sampled tokens under other experts than the ones that produced them: the largest source of rollout-trainer
mismatch on MoE models (verl's ``router_replay.mode=R3``, NeMo-RL's ``router_replay``, SkyRL's
``enable_return_routed_experts``).

- :class:`RoutingRecorder` (generation): forward hooks on every router keep each forward's top-k ids; the HF engine
  assembles them into the rollout layout's ``routed_experts [B, P+R, L, K] int16`` (``engines/interfaces.py``).
- :class:`RouterReplay` (training): a forward hook on every router. While a batch's recorded experts are fed
  (:class:`Routing`, one tensor per model call, aligned with its tokens), each router's output is replaced by the
  recorded ids, with gate weights recomputed from the trainer's own logits as the router does (softmax over all
  experts, gathered at the ids, renormalised when ``norm_topk_prob``): gradients reach the router as usual.
  Positions recorded as -1 keep the router's own top-k. Whether it replays or not, it counts how often the trainer's
  own top-k set differs from the recorded one (``moe/routing_mismatch``, :class:`RoutingStats`).

Qwen3-MoE's router (transformers' ``Qwen3MoeTopKRouter``: ``forward`` returns (logits, scores, indices)) is the one
supported; its MoE layers are found by class name, so importing this module does not import transformers.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROUTERS = ("Qwen3MoeTopKRouter",)  # (logits, top-k weights, top-k ids) = router(hidden [tokens, H])
NOT_RECORDED = -1
MISMATCH = "moe/routing_mismatch"


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The model's MoE routers in layer order (empty for a dense model)."""
    return [m for m in model.modules() if type(m).__name__ in ROUTERS]


class RoutingRecorder:
    """Records the top-k expert ids of every router during generation (a context manager over one ``generate``).

    Each forward of the model is a step: its routers' ids [rows, tokens, L, K]. :meth:`select_rows` applies to the
    steps so far what the KV cache does to its rows (a prompt prefilled once, copied to its rows); :meth:`routed`
    concatenates the steps along the positions."""

    def __init__(self, model: nn.Module, routers: list[nn.Module]) -> None:
        self.model, self.routers = model, routers
        self._steps: list[torch.Tensor] = []
        self._layers: list[torch.Tensor] = []
        self._shape: tuple[int, int] = (0, 0)
        self._hooks: list[Any] = []

    def __enter__(self) -> RoutingRecorder:
        self._hooks = [self.model.register_forward_pre_hook(self._start, with_kwargs=True),
                       self.model.register_forward_hook(self._end)]
        self._hooks += [r.register_forward_hook(self._keep) for r in self.routers]
        return self

    def __exit__(self, *exc: Any) -> None:
        for hook in self._hooks:
            hook.remove()

    def _start(self, _module: nn.Module, _args: Any, kwargs: dict[str, Any]) -> None:
        self._shape = tuple(kwargs["input_ids"].shape)
        self._layers = []

    def _keep(self, _module: nn.Module, _inputs: Any, out: tuple[torch.Tensor, ...]) -> None:
        self._layers.append(out[2].detach().to("cpu", torch.int16).view(*self._shape, -1))

    def _end(self, *_: Any) -> None:
        self._steps.append(torch.stack(self._layers, dim=2))  # [rows, tokens, L, K]

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` of what was recorded so far (repeats allowed)."""
        self._steps = [step.index_select(0, index.cpu()) for step in self._steps]

    def routed(self, width: int) -> torch.Tensor:
        """[rows, width, L, K]: the steps' ids position after position, -1 past the last fed position."""
        ids = torch.cat(self._steps, dim=1)[:, :width]
        return F.pad(ids, (0, 0, 0, 0, 0, width - ids.shape[1]), value=NOT_RECORDED)


@dataclass
class RoutingStats:
    """Recorded (token x layer) entries the trainer saw, and how many of them its own top-k set differed on."""

    mismatched: int = 0
    recorded: int = 0

    @classmethod
    def merged(cls, parts: list[RoutingStats]) -> RoutingStats:
        """One count of several ranks' (each over its own share of the samples)."""
        return cls(sum(p.mismatched for p in parts), sum(p.recorded for p in parts))

    def metrics(self) -> dict[str, float]:
        """``moe/routing_mismatch``: the share of recorded entries whose trainer top-k set differs; none when
        nothing recorded was seen."""
        return {MISMATCH: self.mismatched / self.recorded} if self.recorded else {}


class RouterReplay:
    """Forward hooks on a policy's routers that replay fed routing (``replay``) and count the mismatch of the
    router's own choice with it (always). Nothing is fed: the routers run as they are."""

    def __init__(self, routers: list[nn.Module], replay: bool) -> None:
        self.replay = replay
        self.layers = len(routers)
        self.counting = True  # off while a backward pass recomputes checkpointed layers: counted once
        self.stats = RoutingStats()
        self._current: torch.Tensor | None = None  # [tokens, L, K] of the model call running now
        self._hooks = [r.register_forward_hook(self._hook(layer)) for layer, r in enumerate(routers)]

    @classmethod
    def attach(cls, model: nn.Module, replay: bool) -> RouterReplay | None:
        """Hooks on ``model``'s routers, or None for a dense model (which cannot replay: one line)."""
        routers = moe_routers(model)
        if not routers:
            if replay:
                raise ValueError(f"train.router_replay=replay needs a mixture-of-experts policy, but "
                                 f"{type(model).__name__} has no MoE router ({', '.join(ROUTERS)}): set "
                                 "train.router_replay: off")
            return None
        return cls(routers, replay)

    def feed(self, experts: torch.Tensor | None) -> None:
        """The next model call's recorded experts, [rows, tokens, L, K] as its ``input_ids`` (None: route freely)."""
        self._current = None if experts is None else experts.reshape(-1, *experts.shape[-2:])

    def clear(self) -> None:
        self._current = None

    def take_stats(self) -> RoutingStats:
        """The mismatch counted since the last call."""
        stats, self.stats = self.stats, RoutingStats()
        return stats

    def _hook(self, layer: int):
        def hook(module: nn.Module, _inputs: Any, out: tuple[torch.Tensor, ...]) -> Any:
            if self._current is None:
                return None
            logits, _, own = out
            given = self._current[:, layer].to(own.device, torch.long)
            if given.shape != own.shape:
                raise RuntimeError(f"routing replay: layer {layer}'s router saw {tuple(own.shape)} top-k ids, the fed "
                                   f"routing has {tuple(given.shape)}; the routing is not aligned with the tokens")
            recorded = given[:, 0] != NOT_RECORDED
            if self.counting:
                with torch.no_grad():
                    differs = (own.sort(-1).values != given.sort(-1).values).any(-1) & recorded
                    self.stats.mismatched += int(differs.sum())
                    self.stats.recorded += int(recorded.sum())
            if not self.replay:
                return None
            ids = torch.where(recorded[:, None], given, own)
            weights = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, ids)
            if module.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return logits, weights.to(logits.dtype), ids

        return hook


@dataclass(frozen=True)
class Routing:
    """A batch's recorded experts [B, T, L, K] (aligned with its ``input_ids``) and the hooks that take them."""

    replay: RouterReplay
    experts: torch.Tensor

    def cut(self, rows: Any = slice(None), columns: Any = slice(None)) -> Routing:
        """Rows ``rows`` (a slice or an index tensor) and columns ``columns`` of the recorded experts."""
        if isinstance(rows, torch.Tensor):
            rows = rows.to(self.experts.device)
        return Routing(self.replay, self.experts[rows][:, columns])

    def packed(self, index: torch.Tensor) -> Routing:
        """The real tokens at ``index`` of the flattened [B, T], as one packed row."""
        flat = self.experts.reshape(-1, *self.experts.shape[2:])
        return Routing(self.replay, flat[index.to(flat.device)].unsqueeze(0))

    def feed(self) -> None:
        self.replay.feed(self.experts)


def check_recording(records: bool, engine: Any) -> None:
    """At a generating worker's start: the run plan's ``routed_experts`` column needs an engine that records it
    (the config knows the tiny model's architecture; a ``model.path`` policy is known once loaded)."""
    if records and not getattr(engine, "records_routing", False):
        raise ValueError(f"train.router_replay=replay needs a mixture-of-experts policy whose routing "
                         f"{type(engine).__name__} records, and this policy has no MoE router ({', '.join(ROUTERS)}): "
                         "set train.router_replay: off")


def batch_routing(replay: RouterReplay | None, batch: Any) -> Routing | None:
    """The batch's ``routed_experts`` for ``replay``'s hooks, when both exist."""
    if replay is None or "routed_experts" not in batch.keys():
        return None
    return Routing(replay, batch["routed_experts"])


@contextmanager
def routed(replay: RouterReplay | None):
    """Around a forward (and its backward): whatever was fed is dropped afterwards, so later calls (generation on the
    same module) route freely."""
    try:
        yield
    finally:
        if replay is not None:
            replay.clear()
