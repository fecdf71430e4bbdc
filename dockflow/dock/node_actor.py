"""One dock process per Ray node: the node's warehouses (shards) and the controllers of the consumers placed on
the node, in one asyncio actor.

The design is the paper's (Fig. 4): a controller per worker state, next to it, holding metadata only; warehouses
sharded along the global batch, one per node by default; data moving between workers and warehouses, never
through the driver. What changes is how many processes carry it: a node's dock parts share one process, so a
notification to a controller on the same node is a call in this process (one to another node is a message to
that node's dock process), a get whose samples all live on this node carries their rows in its answer (one round
trip instead of two), and a run has fewer Ray worker processes, each of which wakes 100 times a second even when
idle (``dockflow/background.py``). On the demo this took 10% off the time per iteration (docs/vs_trl.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import ray

from dockflow.background import run_in_background
from dockflow.dock.errors import DockInvalid
from dockflow.dock.netmodel import LinkSpec
from dockflow.dock.node_parts import Arrays, NodeController, NodeWarehouse, location
from dockflow.dock.request import DockRequest
from dockflow.dock.sharding import ShardMap
from dockflow.dock.window import Window


@ray.remote
class DockNodeActor:
    """The dock's parts on one node. ``shards``: the warehouses it holds (none on a node that only hosts
    controllers); ``shape_keeper``: the node process of warehouse 0, which fixes each column's per-sample shape
    for all (None: this one holds warehouse 0, or no warehouse)."""

    def __init__(self, columns: Mapping[str, str], shard_map: ShardMap, shards: Sequence[int],
                 shape_keeper: Any | None = None, link: LinkSpec | None = None) -> None:
        run_in_background()  # its wake-ups wait for a free core rather than preempt a model worker's threads
        self.columns = dict(columns)
        self.shard_map = shard_map
        self.link = link
        self.shape_keeper = shape_keeper
        self.claimed: dict[str, tuple[int, ...]] = {}
        self.warehouses = {s: NodeWarehouse(columns, shard_map, s, self._deliver, self._claim, link) for s in shards}
        self.controllers: dict[str, NodeController] = {}
        self.subscribers: dict[str, tuple[str | None, Any]] = {}  # consumer -> (its node, its node process)

    async def ready(self) -> dict[str, Any]:
        return location()

    async def ping(self) -> bool:
        return True

    # ---- controllers ----------------------------------------------------------------------------
    async def add_controller(self, consumer: str, columns: Sequence[str]) -> tuple[str, ...]:
        """Host the controller of ``consumer`` here; returns the columns it is registered with (an earlier
        registration's, when there was one)."""
        if consumer not in self.controllers:
            self.controllers[consumer] = NodeController(consumer, list(self.columns), self.shard_map, columns, self.link)
        return self.controllers[consumer].state.columns

    async def subscribe(self, consumer: str, host: Any, columns: Sequence[str], node: str | None) -> None:
        """Tell this node's warehouses about the controller of ``consumer`` on ``host`` (``node``): each sends it
        what is already ready and includes it in every later notification."""
        if consumer not in self.subscribers:
            self.subscribers[consumer] = (node, host)
        for warehouse in self.warehouses.values():
            await warehouse.subscribe(consumer, columns, node)

    async def controller_host(self, consumer: str) -> Any | None:
        """The node process that hosts the controller of ``consumer`` (as a warehouse's node knows it)."""
        entry = self.subscribers.get(consumer)
        return entry[1] if entry is not None else None

    async def subscribed(self) -> dict[str, tuple[str | None, Any]]:
        return dict(self.subscribers)

    async def registered_columns(self, consumer: str) -> tuple[str, ...]:
        return self._controller(consumer).state.columns

    async def mark_ready(self, consumer: str, indices: np.ndarray, columns: Sequence[str], meta: Arrays | None,
                         src_node: str | None = None) -> None:
        """A warehouse on another node notifies a controller hosted here."""
        await self._controller(consumer).mark_ready(indices, columns, meta, src_node)

    async def _deliver(self, consumer: str, indices: np.ndarray, columns: Sequence[str], meta: Arrays | None,
                       src_node: str | None) -> None:
        if consumer in self.controllers:  # on this node: a call in this process
            await self.controllers[consumer].mark_ready(indices, columns, meta, src_node)
        else:
            await self.subscribers[consumer][1].mark_ready.remote(consumer, indices, columns, meta, src_node)

    def _controller(self, consumer: str) -> NodeController:
        if consumer not in self.controllers:
            raise DockInvalid(f"consumer {consumer!r} has no controller on this node")
        return self.controllers[consumer]

    # ---- data -----------------------------------------------------------------------------------
    async def claim_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """(Warehouse 0's node) the shape of each column this iteration: the first claim wins."""
        for column, shape in shapes.items():
            self.claimed.setdefault(column, tuple(shape))
        return {c: self.claimed[c] for c in shapes}

    async def _claim(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        if self.shape_keeper is None:
            return await self.claim_shapes(shapes)
        return await self.shape_keeper.claim_shapes.remote(shapes)

    async def put(self, shard: int, indices: np.ndarray, arrays: Arrays, meta: Arrays, peer: str,
                  node: str | None = None) -> None:
        await self.warehouses[shard].put(indices, arrays, meta, peer, node)

    async def read(self, shard: int, indices: np.ndarray, columns: Sequence[str], peer: str,
                   node: str | None = None) -> dict[str, np.ndarray]:
        return await self.warehouses[shard].read(indices, columns, peer, node)

    async def take(self, consumer: str, request: DockRequest, prefer: Sequence[int] | None, peer: str,
                   node: str | None = None) -> tuple[str, Any, Any, dict[int, dict[str, np.ndarray]] | None]:
        """The controller's answer (``NodeController.take``) and, when every chosen sample lives in a warehouse of
        this node, their rows by shard (else None: the client reads them from the warehouses that hold them)."""
        status, chosen, meta = await self._controller(consumer).take(request, prefer, node)
        if status != "ok":
            return status, chosen, meta, None
        parts = self.shard_map.split(chosen)
        if not set(parts) <= set(self.warehouses):
            return status, chosen, meta, None
        columns = list(request.columns)
        rows = {s: await self.warehouses[s].read(chosen[pos], columns, peer, node) for s, pos in parts.items()}
        return status, chosen, meta, rows

    # ---- lifecycle ------------------------------------------------------------------------------
    async def reset(self, keep: np.ndarray, window: Window | None = None) -> None:
        for warehouse in self.warehouses.values():
            warehouse.store.reset(keep, window)
        if len(keep) == 0:
            self.claimed.clear()
        for controller in self.controllers.values():
            await controller.reset(keep, window)

    async def stats(self) -> dict[str, Any]:
        return {
            **location(),
            "warehouses": {s: w.stats() for s, w in self.warehouses.items()},
            "controllers": {c: k.stats() for c, k in self.controllers.items()},
        }
