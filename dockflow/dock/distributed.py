"""The distributed transfer dock (paper Fig. 4): S warehouses hold the data, one controller per consumer holds
ready/consumed metadata, and this client moves data straight between workers and warehouses.

A node's warehouses and the controllers placed on it live in one dock process per node (``DockNodeActor``,
``node_actor.py``). put: split rows by owning warehouse, send each shard to its node's dock process in parallel
(the warehouse then notifies the controllers). get: ask the consumer's controller for indices (it long-polls);
when they all live on the controller's node its answer carries the rows, otherwise read them from the owning
warehouses in parallel, and assemble them in index order.
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
from dockflow.dock.api import DockBatch, DockInvalid, DockSpec, DockUnavailable, TransferDock
from dockflow.dock.errors import get_failure
from dockflow.dock.netmodel import LinkSpec, remove_links
from dockflow.dock.node_actor import DockNodeActor
from dockflow.dock.request import DockRequest
from dockflow.dock.rpc import call, peer_id, unwrap
from dockflow.dock.sharding import ShardMap
from dockflow.dock.wire import from_wire, to_wire, wire_dtypes

# While a get waits longer than this, the client checks that the warehouses are still alive.
_HEALTH_CHECK_EVERY_S = 2.0
# Slack on top of the controller's own timeout before the client gives up on the controller itself.
_CONTROLLER_GRACE_S = 10.0


class DistributedDock(TransferDock):
    """Client of a distributed dock. Picklable (actor handles + spec); every copy talks to the same actors.
    ``shard_hosts[i]``: the dock process of warehouse i's node."""

    def __init__(
        self, spec: DockSpec, shard_hosts: list[Any], warehouse_nodes: list[str], link: LinkSpec | None = None
    ) -> None:
        self.spec = spec
        self.link = link  # the network model (benchmarks); None: off
        self.shard_map = ShardMap(spec.capacity, spec.group_size, len(shard_hosts), spec.shard_block or 0)
        self.shard_hosts = shard_hosts
        self.warehouse_nodes = warehouse_nodes
        self._hosts: dict[str, Any] = self._by_node()  # node -> its dock process, controller-only nodes added
        self._controllers: dict[str, Any] = {}  # consumer -> the dock process hosting its controller
        self._columns: dict[str, tuple[str, ...]] = {}  # consumer -> registered columns (never change)
        self._shards_node: str | None = None  # the node _shards was computed on
        self._shards: list[int] | None = None

    # ---- creation -------------------------------------------------------------------------------
    @classmethod
    def create(cls, spec: DockSpec, link: LinkSpec | None = None) -> DistributedDock:
        nodes = list(spec.warehouse_nodes) if spec.warehouse_nodes else placement.alive_nodes()
        placement.require_alive(nodes, f"the warehouses of dock {spec.name!r}")
        count = spec.num_warehouses or len(nodes)
        nodes = [nodes[i % len(nodes)] for i in range(count)]
        placement.refuse_existing(cls._host_name(spec, nodes[0]), spec.namespace)
        shard_map = ShardMap(spec.capacity, spec.group_size, count, spec.shard_block or 0)
        hosts: dict[str, Any] = {}
        for node in dict.fromkeys(nodes):  # warehouse 0's node first: it keeps the shapes for the others
            shards = [i for i, n in enumerate(nodes) if n == node]
            keeper = hosts[nodes[0]] if hosts else None
            hosts[node] = cls._start_host(spec, node, shard_map, shards, keeper, link)
        try:
            placement.wait_ready({cls._host_name(spec, n): h.ready.remote() for n, h in hosts.items()},
                                 spec.start_timeout_s)
        except DockUnavailable:
            for h in hosts.values():
                ray.kill(h)
            raise
        return cls(spec, [hosts[n] for n in nodes], nodes, link)

    @staticmethod
    def _start_host(spec: DockSpec, node: str, shard_map: ShardMap, shards: list[int], keeper: Any | None,
                    link: LinkSpec | None) -> Any:
        options = placement.pinned(node, DistributedDock._host_name(spec, node), spec.namespace, spec.detached)
        return DockNodeActor.options(**options).remote(wire_dtypes(spec.columns), shard_map, shards, keeper, link)

    @staticmethod
    def _host_name(spec: DockSpec, node: str) -> str:
        return f"{spec.name}/node/{node}"

    def _host_on(self, node: str) -> Any:
        """The dock process of ``node``: the one holding its warehouses, one another client started, or a new one
        that hosts only controllers."""
        if node in self._hosts:
            return self._hosts[node]
        name = self._host_name(self.spec, node)
        try:
            host = ray.get_actor(name, namespace=self.spec.namespace)
        except ValueError:
            try:
                host = self._start_host(self.spec, node, self.shard_map, [], None, self.link)
            except ValueError:  # lost a race with another process starting it
                host = ray.get_actor(name, namespace=self.spec.namespace)
            placement.wait_ready({name: host.ready.remote()}, self.spec.start_timeout_s)
        self._hosts[node] = host
        return host

    # ---- consumers ------------------------------------------------------------------------------
    def register_consumer(self, consumer: str, columns: Sequence[str], node_id: str | None = None) -> None:
        columns = validation.check_columns(self.spec, consumer, columns)
        existing = self._lookup_controller(consumer)
        if existing is not None:
            self._require_columns(consumer, self._registered_columns(consumer), columns)
            return
        node = node_id or placement.current_node()
        placement.require_alive([node], f"the controller of consumer {consumer!r}")
        host = self._host_on(node)
        what = f"registering consumer {consumer!r}"
        have = tuple(call([host.add_controller.remote(consumer, list(columns))], self.spec.rpc_timeout_s, what)[0])
        self._require_columns(consumer, have, columns)  # another process registered it just now
        call([h.subscribe.remote(consumer, host, list(columns), node) for h in self._by_node().values()],
             self.spec.rpc_timeout_s, what)
        self._controllers[consumer] = host
        self._columns[consumer] = columns

    @staticmethod
    def _require_columns(consumer: str, have: Sequence[str], columns: Sequence[str]) -> None:
        if tuple(have) != tuple(columns):
            raise DockInvalid(f"consumer {consumer!r} is already registered with columns {list(have)}")

    def _by_node(self) -> dict[str, Any]:
        """The dock process of each warehouse node, by node (a node holding several warehouses has one)."""
        return dict(zip(self.warehouse_nodes, self.shard_hosts, strict=True))

    def _registered_columns(self, consumer: str) -> tuple[str, ...]:
        if consumer not in self._columns:
            ref = self._controller(consumer).registered_columns.remote(consumer)
            self._columns[consumer] = tuple(call([ref], self.spec.rpc_timeout_s, f"consumer {consumer!r}")[0])
        return self._columns[consumer]

    def _lookup_controller(self, consumer: str) -> Any | None:
        """The dock process hosting the controller of ``consumer`` (as warehouse 0's node knows it), or None."""
        if consumer not in self._controllers:
            ref = self.shard_hosts[0].controller_host.remote(consumer)
            host = call([ref], self.spec.rpc_timeout_s, f"looking up consumer {consumer!r}")[0]
            if host is None:
                return None
            self._controllers[consumer] = host
        return self._controllers[consumer]

    def _controller(self, consumer: str) -> Any:
        handle = self._lookup_controller(consumer)
        if handle is None:
            raise DockInvalid(f"consumer {consumer!r} is not registered with dock {self.spec.name!r}")
        return handle

    def _all_hosts(self) -> list[Any]:
        """Every dock process: the warehouses' nodes', then the nodes' that host only controllers."""
        subscribed = call([self.shard_hosts[0].subscribed.remote()], self.spec.rpc_timeout_s, "listing consumers")[0]
        hosts = self._by_node()
        for node, host in subscribed.values():
            hosts.setdefault(node, host)
        return list(hosts.values())

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
            refs.append(self.shard_hosts[shard].put.remote(shard, shard_index, arrays, shard_meta, peer, *here))
        call(refs, self.spec.rpc_timeout_s, f"put of {len(index)} samples")

    def get(self, request: DockRequest) -> DockBatch:
        consumer = request.consumer
        host = self._controller(consumer)
        columns = self._registered_columns(consumer) if request.columns is None else request.columns
        win = validation.check_window(self.spec, request.window, f"get by {consumer!r}")
        timeout = self.spec.get_timeout_s if request.timeout_s is None else request.timeout_s
        request = request.resolved(columns, win, timeout)
        validation.check_get(self.spec, request)
        ref = host.take.remote(consumer, request, self._local_shards(), peer_id(), *self._here())
        status, indices, meta, rows = self._await_controller(ref, consumer, timeout)
        if status != "ok":
            raise get_failure(status, indices)
        parts = self.shard_map.split(indices)
        if rows is None:
            rows = self._read(indices, parts, list(request.columns), consumer)
        return DockBatch(
            indices=indices.tolist(),
            data=TensorDict(self._assemble(len(indices), parts, rows, request.columns), batch_size=[len(indices)]),
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

    def _await_controller(self, ref: ray.ObjectRef, consumer: str, timeout: float) -> tuple[str, Any, Any, Any]:
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
        for i, host in enumerate(self.shard_hosts):
            try:
                ray.get(host.ping.remote(), timeout=self.spec.rpc_timeout_s)
            except ray.exceptions.RayError as err:
                raise DockUnavailable(
                    f"{what}: warehouse {i} (node {self.warehouse_nodes[i]}) is unavailable: {unwrap(err, 'ping')}"
                ) from None

    def _read(self, indices: np.ndarray, parts: dict[int, np.ndarray], columns: list[str], consumer: str
              ) -> dict[int, dict[str, np.ndarray]]:
        """The rows of ``indices`` from the warehouses that own them, by shard."""
        peer, here = peer_id(), self._here()
        refs = [self.shard_hosts[s].read.remote(s, indices[pos], columns, peer, *here) for s, pos in parts.items()]
        results = call(refs, self.spec.rpc_timeout_s, f"read of {len(indices)} samples for {consumer!r}")
        return dict(zip(parts, results, strict=True))

    def _assemble(self, n: int, parts: dict[int, np.ndarray], rows: dict[int, dict[str, np.ndarray]],
                  columns: Sequence[str]) -> dict[str, torch.Tensor]:
        """One tensor per column, rows in index order, from each shard's piece."""
        out = {}
        for column in columns:
            dtype = self.spec.columns[column]
            pieces = [from_wire(rows[s][column], dtype) for s in parts]
            if len(pieces) == 1:
                out[column] = pieces[0].clone()  # own the memory (the piece may live in the object store)
                continue
            buffer = torch.empty((n, *pieces[0].shape[1:]), dtype=dtype)
            for positions, piece in zip(parts.values(), pieces, strict=True):
                buffer.index_copy_(0, torch.from_numpy(positions), piece)
            out[column] = buffer
        return out

    # ---- lifecycle ------------------------------------------------------------------------------
    def reset(self, keep: Sequence[int] = (), window: tuple[int, int] | None = None) -> None:
        kept, win = validation.check_reset(self.spec, keep, window)
        call([h.reset.remote(kept, win) for h in self._all_hosts()], self.spec.rpc_timeout_s, "reset")

    def stats(self) -> dict[str, Any]:
        results = call([h.stats.remote() for h in self._all_hosts()], self.spec.rpc_timeout_s, "stats")
        by_shard = {s: w for r in results for s, w in r["warehouses"].items()}
        warehouses = [by_shard[s] for s in range(len(self.shard_hosts))]
        controllers = {c: k for r in results for c, k in r["controllers"].items()}
        processes = [*warehouses, *controllers.values()]
        return {
            "backend": "distributed",
            "capacity": self.spec.capacity,
            "group_size": self.spec.group_size,
            "warehouses": warehouses,
            "controllers": controllers,
            "dock_processes": len(results),
            "puts": sum(w["writes"] for w in warehouses),
            "gets": sum(c["gets"] for c in controllers.values()),
            "busiest_bytes": max(process_bytes(p) for p in processes),
        }

    def shutdown(self) -> None:
        try:
            hosts = self._all_hosts()
        except Exception:  # a dead warehouse 0: kill what we know
            hosts = [*self._hosts.values(), *self._controllers.values()]
        for actor in hosts:
            ray.kill(actor, no_restart=True)
        self._controllers.clear()
        if self.link is not None:
            remove_links(self.link.key)


def process_bytes(stats: Mapping[str, Any]) -> int:
    """Bytes a dock process moved: sample data in and out plus metadata in and out."""
    keys = ("bytes_in", "bytes_out", "meta_bytes_in", "meta_bytes_out")
    return sum(int(stats.get(k, 0)) for k in keys)
