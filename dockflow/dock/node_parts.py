"""The parts a dock node process hosts (``node_actor.py``): a controller per consumer placed on the node and a
warehouse per shard placed there (the centralized baseline's one buffer is in ``central_actor.py``).

They wrap ``ControllerState`` and ``WarehouseStore``; data moves as numpy arrays (see ``wire.py``), and the
only things a warehouse tells controllers are indices, column names and metadata scalars. A part keeps the
counters and, under the network model, the node link of the separate process it stands for in the paper's
design, so the messages and bytes each one moves are counted as before. Nothing here imports torch.
"""

from __future__ import annotations

import asyncio
import os
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np
import ray

from dockflow.dock import protocol
from dockflow.dock.controller import ControllerState
from dockflow.dock.errors import DockInvalid, DockUnavailable
from dockflow.dock.longpoll import take_when_ready
from dockflow.dock.netmodel import LinkSpec, NodeLink
from dockflow.dock.protocol import payload_bytes
from dockflow.dock.request import DockRequest
from dockflow.dock.sharding import ShardMap
from dockflow.dock.warehouse import WarehouseStore
from dockflow.dock.window import Window

Arrays = Mapping[str, np.ndarray]
# (consumer, indices, columns, metadata, sending node or None) -> delivered to that consumer's controller
Deliver = Callable[[str, np.ndarray, Sequence[str], Arrays | None, str | None], Awaitable[None]]
ClaimShapes = Callable[[dict[str, tuple[int, ...]]], Awaitable[dict[str, tuple[int, ...]]]]


def nbytes(arrays: Arrays) -> int:
    return sum(a.nbytes for a in arrays.values())


def location() -> dict[str, Any]:
    return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}


def node_link(spec: LinkSpec | None) -> NodeLink | None:
    """This process's node link under the network model (``netmodel.py``); None when the model is off."""
    return NodeLink(spec, ray.get_runtime_context().get_node_id()) if spec is not None else None


def cancelled_message(consumer: str) -> str:
    return (
        f"get by {consumer!r} was cancelled: the dock was reset (a new iteration started) while it waited; "
        "the samples it waited for belong to an iteration that is over"
    )


async def take_unless_reset(
    cond: asyncio.Condition, state: ControllerState, request: DockRequest, prefer: Sequence[int] | None = None
) -> tuple[str, np.ndarray | None]:
    """Long-poll a take of ``request`` (resolved by the client: columns, window, timeout filled in): ("ok",
    indices), ("timeout", None), or ("reset", None) when a reset touched its window meanwhile (the iteration this
    get waited in is over). Statuses are strings, not a sentinel object: Ray may pickle this module's functions
    by value, and a copied sentinel is no longer identical to itself."""
    window = request.window
    resets = state.reset_count(window)
    chosen = await take_when_ready(
        cond,
        lambda: "reset" if state.reset_count(window) != resets else state.take(
            request.batch_size, request.columns, request.whole_groups, window, prefer, request.dp_share
        ),
        request.timeout_s,
    )
    if chosen is None:
        return "timeout", None
    if isinstance(chosen, str):
        return "reset", None
    return "ok", chosen


class NodeController:
    """Ready/consumed metadata of one consumer; its gets long-poll here until enough samples are ready."""

    def __init__(self, consumer: str, all_columns: Sequence[str], shard_map: ShardMap, columns: Sequence[str],
                 link: LinkSpec | None = None) -> None:
        self.link = node_link(link)
        owners = shard_map.owner(np.arange(shard_map.capacity))
        self.state = ControllerState(consumer, all_columns, shard_map.capacity, shard_map.group_size, columns, owners)
        self.cond = asyncio.Condition()
        self.waiting = 0  # gets in progress
        self.meta_bytes_in = 0
        self.meta_bytes_out = 0

    async def mark_ready(self, indices: np.ndarray, columns: Sequence[str], meta: Arrays | None,
                         src_node: str | None = None) -> None:
        if self.link is not None:  # network model: the notification comes in over this node's link
            await self.link.transfer(payload_bytes(indices, meta), src_node)
        async with self.cond:
            self.state.mark_ready(indices, columns, meta)
            self.cond.notify_all()
        self.meta_bytes_in += indices.nbytes + nbytes(meta or {})

    async def take(self, request: DockRequest, prefer: Sequence[int] | None = None, node: str | None = None
                   ) -> tuple[str, Any, Any]:
        """("ok", indices, meta), ("timeout", readiness message, None), or ("reset", message, None) when a reset
        ended the iteration this get waited in (its requester may be gone: it must not take the next one's).
        ``prefer``: shards (warehouses) whose samples go first, those on the requester's node."""
        state, r = self.state, request
        state.validate(r.batch_size, r.columns, r.whole_groups, r.window, r.dp_share)
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.waiting += 1
        try:
            status, chosen = await take_unless_reset(self.cond, state, request, prefer)
        finally:
            self.waiting -= 1
        if status == "reset":
            return "reset", cancelled_message(self.state.consumer), None
        if status == "timeout":
            needed = state.samples_needed(r.batch_size, r.window, r.dp_share)
            readiness = state.readiness(needed, r.columns, r.whole_groups, r.window)
            return "timeout", readiness.message(loop.time() - started), None
        meta = self.state.meta.take(chosen)
        self.meta_bytes_out += chosen.nbytes + nbytes(meta)
        if self.link is not None:  # network model: the answer goes out over this node's link to ``node``
            await self.link.transfer(payload_bytes(chosen, meta), node)
        return "ok", chosen, meta

    async def reset(self, keep: np.ndarray, window: Window | None = None) -> None:
        async with self.cond:
            self.state.reset(keep, window)
            self.cond.notify_all()

    def stats(self) -> dict[str, Any]:
        return {
            **location(),
            **self.state.stats(),
            "waiting_gets": self.waiting,
            "columns": list(self.state.columns),
            "meta_bytes_in": self.meta_bytes_in,
            "meta_bytes_out": self.meta_bytes_out,
            "bytes_in": 0,  # a controller never sees sample data
            "bytes_out": 0,
            **(self.link.stats() if self.link is not None else {}),
        }


class NodeWarehouse:
    """Column data of one shard. A put stores rows here, then tells every subscribed controller what became ready
    (through ``deliver``: in this process, or to the node process that hosts the controller)."""

    def __init__(self, columns: Mapping[str, str], shard_map: ShardMap, shard: int, deliver: Deliver,
                 claim_shapes: ClaimShapes, link: LinkSpec | None = None) -> None:
        self.link = node_link(link)
        self.node = self.link.node_id if self.link is not None else None
        self.store = WarehouseStore(columns, shard_map, shard)
        self.deliver = deliver
        self.claim_shapes = claim_shapes  # warehouse 0's host decides per-sample shapes for all
        self.interests: dict[str, set[str]] = {}  # consumer -> the columns it registered
        self.controller_nodes: dict[str, str | None] = {}
        self.bytes_by_peer: dict[str, int] = defaultdict(int)
        self.meta_bytes_out = 0

    async def subscribe(self, consumer: str, columns: Sequence[str], node: str | None = None) -> None:
        """Send the new controller what is already ready, then include it in every later notification.
        ``node``: the controller's node (used only by the network model)."""
        if consumer in self.interests:
            return
        ready, meta = self.store.snapshot()
        self.interests[consumer] = set(columns)  # same event-loop step: no put can slip in between
        self.controller_nodes[consumer] = node
        notes = [(self.store.owned, [], meta)] + [(idx, [c], None) for c, idx in ready.items() if len(idx)]
        await self._notified([self._notify(consumer, idx, cols, m) for idx, cols, m in notes], [consumer] * len(notes))

    def _notify(self, consumer: str, indices: np.ndarray, columns: Sequence[str], meta: Arrays | None) -> Any:
        """One notification (an awaitable); under the network model it first holds this node's link."""
        if self.link is None:
            return self.deliver(consumer, indices, columns, meta, None)
        return self._notify_over_link(consumer, indices, columns, meta)

    async def _notify_over_link(self, consumer: str, indices: np.ndarray, columns: Sequence[str],
                                meta: Arrays | None) -> None:
        assert self.link is not None
        await self.link.transfer(payload_bytes(indices, meta), self.controller_nodes.get(consumer))
        await self.deliver(consumer, indices, columns, meta, self.node)

    async def _notified(self, calls: list[Any], consumers: list[str]) -> None:
        results = await asyncio.gather(*calls, return_exceptions=True)
        for consumer, result in zip(consumers, results, strict=True):
            if isinstance(result, Exception):
                raise DockUnavailable(
                    f"warehouse {self.store.shard} could not notify the controller of consumer "
                    f"{consumer!r}: {type(result).__name__}: {result}"
                )

    async def put(self, indices: np.ndarray, arrays: Arrays, meta: Arrays, peer: str, node: str | None = None) -> None:
        if self.link is not None:  # network model: the rows come in over this node's link from ``node``
            await self.link.transfer(payload_bytes(indices, arrays, meta), node)
        unknown = sorted(set(arrays) - set(self.store.dtypes))
        if unknown:
            raise DockInvalid(f"unknown columns {unknown}; the dock has {list(self.store.dtypes)}")
        new = {c: tuple(a.shape[1:]) for c, a in arrays.items() if c not in self.store.shapes}
        if new:
            for column, shape in (await self.claim_shapes(new)).items():
                self.store.fix_shape(column, shape)
        self.store.write(indices, arrays, meta)
        self.bytes_by_peer[peer] += nbytes(arrays)
        columns = list(arrays)
        # Metadata goes to every controller; readiness only to those whose consumer reads these columns.
        consumers = protocol.notify_targets(self.interests, columns, bool(meta))
        calls = [self._notify(c, indices, columns, meta) for c in consumers]
        self.meta_bytes_out += len(calls) * (indices.nbytes + nbytes(meta))
        await self._notified(calls, consumers)

    async def read(self, indices: np.ndarray, columns: Sequence[str], peer: str, node: str | None = None
                   ) -> dict[str, np.ndarray]:
        arrays = self.store.read(indices, columns)
        self.bytes_by_peer[peer] += nbytes(arrays)
        if self.link is not None:  # network model: indices in, rows out, over this node's link
            await self.link.transfer(payload_bytes(indices, arrays), node)
        return arrays

    def stats(self) -> dict[str, Any]:
        store = self.store
        return {
            **location(),
            "shard": store.shard,
            "owned": len(store.owned),
            "writes": store.writes,
            "reads": store.reads,
            "bytes_in": store.bytes_in,
            "bytes_out": store.bytes_out,
            "bytes_by_peer": dict(self.bytes_by_peer),
            "meta_bytes_out": self.meta_bytes_out,
            "stored_bytes": store.nbytes(),
            "ready": {c: int(b[store.owned].sum()) for c, b in store.ready.items()},
            "controllers": sorted(self.interests),
            **(self.link.stats() if self.link is not None else {}),
        }
