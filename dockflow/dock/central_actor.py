"""The one Ray actor of the centralized baseline (the paper's replay buffer, Fig. 2): all samples and every
consumer's bookkeeping in one process, reusing ``WarehouseStore`` (one shard) and ``ControllerState``."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import ray

from dockflow.background import run_in_background
from dockflow.dock.controller import ControllerState
from dockflow.dock.errors import DockInvalid
from dockflow.dock.netmodel import LinkSpec
from dockflow.dock.node_parts import cancelled_message, location, nbytes, node_link, take_unless_reset
from dockflow.dock.protocol import payload_bytes
from dockflow.dock.request import DockRequest
from dockflow.dock.sharding import ShardMap
from dockflow.dock.warehouse import WarehouseStore
from dockflow.dock.window import Window


@ray.remote
class CentralBufferActor:
    """All samples, all consumers, one process."""

    def __init__(
        self, columns: Mapping[str, str], capacity: int, group_size: int, link: LinkSpec | None = None
    ) -> None:
        run_in_background()  # its wake-ups wait for a free core rather than preempt a model worker's threads
        self.link = node_link(link)
        self.store = WarehouseStore(columns, ShardMap(capacity, group_size, 1), 0)
        self.consumers: dict[str, ControllerState] = {}
        self.cond = asyncio.Condition()
        self.waiting: dict[str, int] = defaultdict(int)  # gets in progress per consumer
        self.bytes_by_peer: dict[str, int] = defaultdict(int)

    async def ready(self) -> dict[str, Any]:
        return location()

    async def register(self, consumer: str, columns: Sequence[str]) -> None:
        if consumer in self.consumers:
            if self.consumers[consumer].columns != tuple(columns):
                raise DockInvalid(
                    f"consumer {consumer!r} is already registered with columns {list(self.consumers[consumer].columns)}"
                )
            return
        store = self.store
        state = ControllerState(consumer, list(store.dtypes), store.shard_map.capacity, store.shard_map.group_size, columns)
        ready, meta = store.snapshot()
        state.mark_ready(store.owned, [], meta)
        for column, indices in ready.items():
            state.mark_ready(indices, [column])
        self.consumers[consumer] = state

    async def columns(self, consumer: str) -> tuple[str, ...]:
        return self._state(consumer).columns

    def _state(self, consumer: str) -> ControllerState:
        if consumer not in self.consumers:
            raise DockInvalid(f"consumer {consumer!r} is not registered")
        return self.consumers[consumer]

    async def put(
        self,
        indices: np.ndarray,
        arrays: Mapping[str, np.ndarray],
        meta: Mapping[str, np.ndarray],
        peer: str,
        node: str | None = None,
    ) -> None:
        if self.link is not None:  # network model: the rows come in over this node's link from ``node``
            await self.link.transfer(payload_bytes(indices, arrays, meta), node)
        async with self.cond:
            self.store.write(indices, arrays, meta)
            for state in self.consumers.values():
                state.mark_ready(indices, list(arrays), meta)
            self.cond.notify_all()
        self.bytes_by_peer[peer] += nbytes(arrays)

    async def get(self, request: DockRequest, peer: str, node: str | None = None) -> tuple[str, Any, Any, Any]:
        """("ok", indices, arrays, meta), ("timeout", message, None, None) or ("reset", message, None, None)."""
        r = request
        state = self._state(r.consumer)
        state.validate(r.batch_size, r.columns, r.whole_groups, r.window, r.dp_share)
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.waiting[r.consumer] += 1
        try:
            status, chosen = await take_unless_reset(self.cond, state, request)
        finally:
            self.waiting[r.consumer] -= 1
        if status == "reset":
            return "reset", cancelled_message(r.consumer), None, None
        if status == "timeout":
            needed = state.samples_needed(r.batch_size, r.window, r.dp_share)
            message = state.readiness(needed, r.columns, r.whole_groups, r.window).message(loop.time() - started)
            return "timeout", message, None, None
        arrays = self.store.read(chosen, list(r.columns))
        self.bytes_by_peer[peer] += nbytes(arrays)
        meta = state.meta.take(chosen)
        if self.link is not None:  # network model: indices, rows and metadata go out over this node's link
            await self.link.transfer(payload_bytes(chosen, arrays, meta), node)
        return "ok", chosen, arrays, meta

    async def reset(self, keep: np.ndarray, window: Window | None = None) -> None:
        async with self.cond:
            self.store.reset(keep, window)
            for state in self.consumers.values():
                state.reset(keep, window)
            self.cond.notify_all()

    async def stats(self) -> dict[str, Any]:
        store = self.store
        return {
            **location(),
            "writes": store.writes,
            "reads": store.reads,
            "bytes_in": store.bytes_in,
            "bytes_out": store.bytes_out,
            "bytes_by_peer": dict(self.bytes_by_peer),
            "stored_bytes": store.nbytes(),
            "controllers": {c: {**s.stats(), "waiting_gets": self.waiting[c]} for c, s in self.consumers.items()},
            **(self.link.stats() if self.link is not None else {}),
        }
