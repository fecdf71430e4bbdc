"""The distributed transfer dock (paper Fig. 4): S warehouse actors hold the data, one controller actor per
consumer holds ready/consumed metadata, and this client moves data straight between workers and warehouses.

put: split rows by owning warehouse, send each shard to its warehouse in parallel (the warehouse then
notifies the controllers). get: ask the consumer's controller for indices (it long-polls), then read the
rows from the owning warehouses in parallel and assemble them in index order.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import ray
import torch
from tensordict import TensorDict

from dockflow.dock import placement, protocol, validation
from dockflow.dock.actors import ControllerActor, WarehouseActor
from dockflow.dock.api import DockBatch, DockInvalid, DockSpec, DockUnavailable, TransferDock
from dockflow.dock.errors import get_failure
from dockflow.dock.netmodel import LinkSpec, remove_links
from dockflow.dock.request import DockRequest
from dockflow.dock.rpc import call, peer_id, unwrap
from dockflow.dock.sharding import ShardMap
from dockflow.dock.wire import from_wire, to_wire, wire_dtypes

# While a get waits longer than this, the client checks that the warehouses are still alive.
_HEALTH_CHECK_EVERY_S = 2.0
# Slack on top of the controller's own timeout before the client gives up on the controller itself.
_CONTROLLER_GRACE_S = 10.0


class DistributedDock(TransferDock):
    """Client of a distributed dock. Picklable (actor handles + spec); every copy talks to the same actors."""

    def __init__(
        self, spec: DockSpec, warehouses: list[Any], warehouse_nodes: list[str], link: LinkSpec | None = None
    ) -> None:
        self.spec = spec
        self.link = link  # the network model (benchmarks); None: off
        self.shard_map = ShardMap(spec.capacity, spec.group_size, len(warehouses), spec.shard_block or 0)
        self.warehouses = warehouses
        self.warehouse_nodes = warehouse_nodes
        self._controllers: dict[str, Any] = {}
        self._columns: dict[str, tuple[str, ...]] = {}  # consumer -> registered columns (never change)
        self._shards_node: str | None = None  # the node _shards was computed on
        self._shards: list[int] | None = None

    # ---- creation -------------------------------------------------------------------------------
    @classmethod
    def create(cls, spec: DockSpec) -> DistributedDock:
        nodes = list(spec.warehouse_nodes) if spec.warehouse_nodes else placement.alive_nodes()
        placement.require_alive(nodes, f"the warehouses of dock {spec.name!r}")
        count = spec.num_warehouses or len(nodes)
        nodes = [nodes[i % len(nodes)] for i in range(count)]
        names = [cls._warehouse_name(spec, i) for i in range(count)]
        placement.refuse_existing(names[0], spec.namespace)
        shard_map = ShardMap(spec.capacity, spec.group_size, count, spec.shard_block or 0)
        dtypes = wire_dtypes(spec.columns)
        link = LinkSpec(spec.nic_mib_per_s) if spec.nic_mib_per_s is not None else None
        extra = (link,) if link is not None else ()
        warehouses: list[Any] = []
        for i, (name, node) in enumerate(zip(names, nodes, strict=True)):
            keeper = warehouses[0] if warehouses else None
            options = placement.pinned(node, name, spec.namespace, spec.detached)
            warehouses.append(WarehouseActor.options(**options).remote(dtypes, shard_map, i, keeper, *extra))
        try:
            placement.wait_ready({n: w.ready.remote() for n, w in zip(names, warehouses, strict=True)},
                                 spec.start_timeout_s)
        except DockUnavailable:
            for w in warehouses:
                ray.kill(w)
            raise
        return cls(spec, warehouses, nodes, link)

    @staticmethod
    def _warehouse_name(spec: DockSpec, i: int) -> str:
        return f"{spec.name}/warehouse/{i}"

    def _controller_name(self, consumer: str) -> str:
        return f"{self.spec.name}/controller/{consumer}"

    # ---- consumers ------------------------------------------------------------------------------
    def register_consumer(self, consumer: str, columns: Sequence[str], node_id: str | None = None) -> None:
        columns = validation.check_columns(self.spec, consumer, columns)
        existing = self._lookup_controller(consumer)
        if existing is not None:
            have = tuple(call([existing.columns.remote()], self.spec.rpc_timeout_s, f"consumer {consumer!r}")[0])
            if have != columns:
                raise DockInvalid(f"consumer {consumer!r} is already registered with columns {list(have)}")
            return
        node = node_id or placement.current_node()
        placement.require_alive([node], f"the controller of consumer {consumer!r}")
        name = self._controller_name(consumer)
        extra = (self.link,) if self.link is not None else ()
        try:
            controller = ControllerActor.options(**placement.pinned(node, name, self.spec.namespace, self.spec.detached)).remote(
                consumer, list(self.spec.columns), self.shard_map, list(columns), *extra
            )
        except ValueError:  # lost a race with another process registering the same consumer
            return self.register_consumer(consumer, columns, node_id)
        placement.wait_ready({name: controller.ready.remote()}, self.spec.start_timeout_s)
        where = (node,) if self.link is not None else ()
        call([w.add_controller.remote(consumer, controller, list(columns), *where) for w in self.warehouses],
             self.spec.rpc_timeout_s, f"registering consumer {consumer!r}")
        self._controllers[consumer] = controller
        self._columns[consumer] = columns

    def _registered_columns(self, consumer: str) -> tuple[str, ...]:
        if consumer not in self._columns:
            controller = self._controller(consumer)
            ref = controller.columns.remote()
            self._columns[consumer] = tuple(call([ref], self.spec.rpc_timeout_s, f"consumer {consumer!r}")[0])
        return self._columns[consumer]

    def _lookup_controller(self, consumer: str) -> Any | None:
        if consumer in self._controllers:
            return self._controllers[consumer]
        try:
            handle = ray.get_actor(self._controller_name(consumer), namespace=self.spec.namespace)
        except ValueError:
            return None
        self._controllers[consumer] = handle
        return handle

    def _controller(self, consumer: str) -> Any:
        handle = self._lookup_controller(consumer)
        if handle is None:
            raise DockInvalid(f"consumer {consumer!r} is not registered with dock {self.spec.name!r}")
        return handle

    def consumers(self) -> dict[str, Any]:
        """Registered consumers and their controller handles (as warehouse 0 knows them)."""
        return call([self.warehouses[0].consumers.remote()], self.spec.rpc_timeout_s, "listing consumers")[0]

    # ---- data -----------------------------------------------------------------------------------
    def put(
        self,
        indices: Sequence[int],
        data: TensorDict,
        meta: Mapping[str, Sequence[int] | torch.Tensor] | None = None,
    ) -> None:
        index, tensors, meta_arrays = validation.check_put(self.spec, indices, data, meta)
        if len(index) == 0:
            return
        peer = peer_id()
        here = self._here()
        refs = []
        for shard, positions in self.shard_map.split(index).items():
            if len(positions) == len(index):
                rows, shard_meta = tensors, meta_arrays
                shard_index = index
            else:
                sel = torch.from_numpy(positions)
                rows = {c: t.index_select(0, sel) for c, t in tensors.items()}
                shard_meta = {k: v[positions] for k, v in meta_arrays.items()}
                shard_index = index[positions]
            arrays = {c: to_wire(t) for c, t in rows.items()}
            refs.append(self.warehouses[shard].put.remote(shard_index, arrays, shard_meta, peer, *here))
        call(refs, self.spec.rpc_timeout_s, f"put of {len(index)} samples")

    def get(self, request: DockRequest) -> DockBatch:
        consumer = request.consumer
        controller = self._controller(consumer)
        columns = self._registered_columns(consumer) if request.columns is None else request.columns
        win = validation.check_window(self.spec, request.window, f"get by {consumer!r}")
        timeout = self.spec.get_timeout_s if request.timeout_s is None else request.timeout_s
        request = request.resolved(columns, win, timeout)
        validation.check_get(self.spec, request)
        ref = controller.take.remote(request, self._local_shards(), *self._here())
        status, indices, meta = self._await_controller(ref, consumer, timeout)
        if status != "ok":
            raise get_failure(status, indices)
        data = self._read(indices, list(request.columns), consumer)
        return DockBatch(
            indices=indices.tolist(),
            data=TensorDict(data, batch_size=[len(indices)]),
            meta={k: torch.from_numpy(v) for k, v in meta.items()},
        )

    def _local_shards(self) -> list[int] | None:
        """Warehouses on this process's node (a get prefers their samples); None when that is all or none."""
        node = placement.current_node()
        if self._shards_node != node:  # a pickled copy may run on another node
            self._shards_node, self._shards = node, protocol.local_shards(self.warehouse_nodes, node)
        return self._shards

    def _here(self) -> tuple[str, ...]:
        """Under the network model, this process's node (sent along so dock processes know what crosses nodes);
        otherwise nothing, and the calls are exactly the unmodelled ones."""
        return (placement.current_node(),) if self.link is not None else ()

    def _await_controller(self, ref: ray.ObjectRef, consumer: str, timeout: float) -> tuple[str, Any, Any]:
        """Wait for the controller's answer; meanwhile report dead warehouses instead of waiting on them."""
        what = f"get by consumer {consumer!r}"
        deadline = time.monotonic() + timeout + _CONTROLLER_GRACE_S
        while True:
            remaining = deadline - time.monotonic()
            done, _ = ray.wait([ref], timeout=max(0.0, min(_HEALTH_CHECK_EVERY_S, remaining)))
            if done:
                return call(done, self.spec.rpc_timeout_s, what)[0]
            if remaining <= 0:
                ray.cancel(ref)
                raise DockUnavailable(f"{what}: the controller did not answer within {timeout + _CONTROLLER_GRACE_S:.0f}s")
            self._check_warehouses(what)

    def _check_warehouses(self, what: str) -> None:
        for i, warehouse in enumerate(self.warehouses):
            try:
                ray.get(warehouse.ping.remote(), timeout=self.spec.rpc_timeout_s)
            except ray.exceptions.RayError as err:
                raise DockUnavailable(
                    f"{what}: warehouse {i} (node {self.warehouse_nodes[i]}) is unavailable: {unwrap(err, 'ping')}"
                ) from None

    def _read(self, indices: np.ndarray, columns: list[str], consumer: str) -> dict[str, torch.Tensor]:
        peer = peer_id()
        here = self._here()
        parts = self.shard_map.split(indices)
        refs = [self.warehouses[s].read.remote(indices[pos], columns, peer, *here) for s, pos in parts.items()]
        results = call(refs, self.spec.rpc_timeout_s, f"read of {len(indices)} samples for {consumer!r}")
        out = {}
        for column in columns:
            dtype = self.spec.columns[column]
            pieces = [from_wire(r[column], dtype) for r in results]
            if len(pieces) == 1:
                out[column] = pieces[0].clone()  # own the memory (the piece may live in the object store)
                continue
            buffer = torch.empty((len(indices), *pieces[0].shape[1:]), dtype=dtype)
            for positions, piece in zip(parts.values(), pieces, strict=True):
                buffer.index_copy_(0, torch.from_numpy(positions), piece)
            out[column] = buffer
        return out

    # ---- lifecycle ------------------------------------------------------------------------------
    def reset(self, keep: Sequence[int] = (), window: tuple[int, int] | None = None) -> None:
        kept, win = validation.check_reset(self.spec, keep, window)
        controllers = list(self.consumers().values())
        refs = [a.reset.remote(kept, win) for a in [*self.warehouses, *controllers]]
        call(refs, self.spec.rpc_timeout_s, "reset")

    def stats(self) -> dict[str, Any]:
        consumers = self.consumers()
        refs = [w.stats.remote() for w in self.warehouses] + [c.stats.remote() for c in consumers.values()]
        results = call(refs, self.spec.rpc_timeout_s, "stats")
        warehouses = results[: len(self.warehouses)]
        controllers = dict(zip(consumers, results[len(self.warehouses):], strict=True))
        processes = [*warehouses, *controllers.values()]
        return {
            "backend": "distributed",
            "capacity": self.spec.capacity,
            "group_size": self.spec.group_size,
            "warehouses": warehouses,
            "controllers": controllers,
            "puts": sum(w["writes"] for w in warehouses),
            "gets": sum(c["gets"] for c in controllers.values()),
            "busiest_bytes": max(process_bytes(p) for p in processes),
        }

    def shutdown(self) -> None:
        try:
            controllers = list(self.consumers().values())
        except Exception:  # a dead warehouse 0: kill what we know
            controllers = list(self._controllers.values())
        for actor in [*controllers, *self.warehouses]:
            ray.kill(actor, no_restart=True)
        self._controllers.clear()
        if self.link is not None:
            remove_links(self.link.key)


def process_bytes(stats: Mapping[str, Any]) -> int:
    """Bytes a dock process moved: sample data in and out plus metadata in and out."""
    keys = ("bytes_in", "bytes_out", "meta_bytes_in", "meta_bytes_out")
    return sum(int(stats.get(k, 0)) for k in keys)
