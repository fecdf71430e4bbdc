"""The transfer dock's client API: the only thing workers and stages import from ``dockflow.dock``.

A dock holds ``capacity`` samples: 1 + ``train.max_staleness`` windows, one per iteration in flight (the one being
trained and those generated ahead of it), each the iteration's global batch of G prompts x N responses (times
the sampling rounds); the run plan's ``RunPlan.dock_capacity`` and ``RunPlan.dock_window`` size and place them.
Each sample has a global index in ``[0, capacity)``; the N samples of a prompt are one group ``[g*N, (g+1)*N)``.
Producers ``put`` column data for some indices; consumers (worker states such as ``actor_update``)
``get`` indices whose requested columns are ready and that they have not consumed yet. The backends
(distributed warehouses + controllers, or one centralized buffer) sit behind this interface.

    dock = create_dock(DockSpec(columns={"responses": torch.long, "rewards": torch.float32},
                                capacity=256, group_size=8))
    dock.register_consumer("reward", ["responses"])
    dock.put([0, 1], TensorDict({"responses": r}, batch_size=[2]), meta={"prompt_id": [0, 0]})
    batch = dock.get(DockRequest("reward", batch_size=2))   # DockBatch(indices=[0, 1], data=..., meta=...)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from dockflow.dock.errors import (
    META_KEYS,
    DockCancelled,
    DockError,
    DockInvalid,
    DockTimeout,
    DockUnavailable,
)
from dockflow.dock.request import DockRequest

if TYPE_CHECKING:  # the actors import this module; keep tensordict (slow to import) out of them
    from tensordict import TensorDict

__all__ = [
    "META_KEYS",
    "DockBatch",
    "DockCancelled",
    "DockError",
    "DockInvalid",
    "DockRequest",
    "DockSpec",
    "DockTimeout",
    "DockUnavailable",
    "TransferDock",
]


@dataclass(frozen=True)
class DockSpec:
    """What a dock holds: its column schema, its size (``capacity``: every window) and the group size."""

    columns: Mapping[str, torch.dtype]
    capacity: int
    group_size: int = 1
    backend: Literal["distributed", "centralized"] = "distributed"
    num_warehouses: int | None = None  # None: one per alive Ray node
    name: str = "dock"  # prefix of the named Ray actors
    namespace: str | None = None  # Ray namespace of the actors; None = the current one
    get_timeout_s: float = 300.0
    # Additions beyond the first contract (all optional):
    warehouse_nodes: Sequence[str] | None = None  # Ray node ids, warehouse i on warehouse_nodes[i]
    rpc_timeout_s: float = 60.0  # bound on puts, reads, resets, stats
    start_timeout_s: float = 180.0  # bound on actor start-up (a new Python process per actor)
    shard_block: int | None = None  # samples per block dealt round-robin to warehouses; None: group_size
    detached: bool = False  # actors outlive their creator (the KFP setup task); shutdown() must be called

    def __post_init__(self) -> None:
        if self.capacity <= 0 or self.group_size <= 0 or self.capacity % self.group_size:
            raise DockInvalid(
                f"capacity ({self.capacity}) must be a positive multiple of group_size ({self.group_size})"
            )
        if self.backend not in ("distributed", "centralized"):
            raise DockInvalid(f"backend must be 'distributed' or 'centralized', not {self.backend!r}")
        if not self.columns:
            raise DockInvalid("a dock needs at least one column")
        for column, dtype in self.columns.items():
            if not isinstance(dtype, torch.dtype):
                raise DockInvalid(f"column {column!r}: dtype must be a torch.dtype, not {dtype!r}")
        if self.num_warehouses is not None and self.num_warehouses <= 0:
            raise DockInvalid(f"num_warehouses must be positive, not {self.num_warehouses}")
        if self.shard_block is not None and (self.shard_block <= 0 or self.shard_block % self.group_size):
            raise DockInvalid(f"shard_block ({self.shard_block}) must be a positive multiple of group_size")
        if self.warehouse_nodes is not None and self.num_warehouses not in (None, len(self.warehouse_nodes)):
            raise DockInvalid("num_warehouses and len(warehouse_nodes) disagree")


@dataclass
class DockBatch:
    """What a get returns: global indices (ascending), the requested columns, and their metadata."""

    indices: list[int]
    data: TensorDict
    meta: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.indices)


class TransferDock(ABC):
    """Client of a transfer dock. Picklable: pass it to Ray actors, which then talk to the backend."""

    spec: DockSpec

    @abstractmethod
    def register_consumer(self, consumer: str, columns: Sequence[str], node_id: str | None = None) -> None:
        """Declare a worker state and the columns it reads (creates its controller).

        ``node_id``: the Ray node the controller is placed on (next to the consumer); None = the
        caller's node. Registering the same consumer again with the same columns is a no-op.
        """

    @abstractmethod
    def put(
        self,
        indices: Sequence[int],
        data: TensorDict,
        meta: Mapping[str, Sequence[int] | torch.Tensor] | None = None,
    ) -> None:
        """Write columns for ``indices``; ``data.batch_size[0] == len(indices)``; meta keys from META_KEYS."""

    @abstractmethod
    def get(self, request: DockRequest) -> DockBatch:
        """Block until ``request.batch_size`` unconsumed samples have its columns ready, mark them consumed,
        return them (``DockRequest`` says what each field asks for).

        Returns the lowest ready indices, ascending, so a producer that writes in index order gives every
        consumer the same batches run after run. With ``dp_share=(rank, ranks)`` the controller splits each
        mini-batch of ``ranks * batch_size`` samples into equal-count shares balanced by response length (from
        metadata, before any data is read), and each rank's k-th get returns its share of the k-th mini-batch.
        All ranks must ask for the same sizes. The client checks the request's form before sending it
        (``dock.validation.check_get``); the controller checks what only its state knows (the consumer's
        registered columns, enough unconsumed samples left) and repeats the form checks for requests that
        reach its actor without a client.
        """

    @abstractmethod
    def reset(self, keep: Sequence[int] = (), window: tuple[int, int] | None = None) -> None:
        """Start a new iteration: drop all data and readiness, except the samples in ``keep``.

        With ``window=(lo, hi)`` only that slice starts over (``keep`` must lie in it): iterations that own
        other windows keep their samples, and their waiting gets go on.
        """

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """Counters: puts, gets, bytes in/out per process, ready/consumed per consumer."""

    @abstractmethod
    def shutdown(self) -> None:
        """Kill the dock's actors."""
