"""Client of the centralized baseline (the paper's conventional replay buffer, its "MSRLB" ablation): one
actor (``CentralBufferActor`` in ``central_actor.py``) holds all data and every consumer's bookkeeping, reusing
``WarehouseStore`` (one shard = the whole batch) and ``ControllerState`` (one per consumer); every byte of
every put and get passes through it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ray
import torch
from tensordict import TensorDict

from dockflow.dock import placement, validation
from dockflow.dock.api import DockBatch, DockSpec, DockUnavailable, TransferDock
from dockflow.dock.central_actor import CentralBufferActor
from dockflow.dock.errors import get_failure
from dockflow.dock.netmodel import LinkSpec, remove_links
from dockflow.dock.request import DockRequest
from dockflow.dock.rpc import call, peer_id
from dockflow.dock.wire import from_wire, tensors_to_wire, wire_dtypes

_GRACE_S = 10.0  # slack on top of the buffer's own get timeout before the client gives up on it


class CentralizedDock(TransferDock):
    """Client of the centralized buffer: the same API, one actor behind it."""

    def __init__(self, spec: DockSpec, buffer: Any, node_id: str, link: LinkSpec | None = None) -> None:
        self.spec = spec
        self.link = link  # the network model (benchmarks); None: off
        self.buffer = buffer
        self.node_id = node_id
        self._columns: dict[str, tuple[str, ...]] = {}  # consumer -> registered columns (never change)

    @classmethod
    def create(cls, spec: DockSpec, link: LinkSpec | None = None) -> CentralizedDock:
        node = spec.warehouse_nodes[0] if spec.warehouse_nodes else placement.alive_nodes()[0]
        placement.require_alive([node], f"the buffer of dock {spec.name!r}")
        name = f"{spec.name}/buffer"
        placement.refuse_existing(name, spec.namespace)
        extra = (link,) if link is not None else ()
        buffer = CentralBufferActor.options(**placement.pinned(node, name, spec.namespace, spec.detached)).remote(
            wire_dtypes(spec.columns), spec.capacity, spec.group_size, *extra
        )
        try:
            placement.wait_ready({name: buffer.ready.remote()}, spec.start_timeout_s)
        except DockUnavailable:
            ray.kill(buffer)
            raise
        return cls(spec, buffer, node, link)

    def register_consumer(self, consumer: str, columns: Sequence[str], node_id: str | None = None) -> None:
        columns = validation.check_columns(self.spec, consumer, columns)
        call([self.buffer.register.remote(consumer, list(columns))], self.spec.rpc_timeout_s,
             f"registering consumer {consumer!r}")
        self._columns[consumer] = columns

    def put(
        self,
        indices: Sequence[int],
        data: TensorDict,
        meta: Mapping[str, Sequence[int] | torch.Tensor] | None = None,
    ) -> None:
        index, tensors, meta_arrays = validation.check_put(self.spec, indices, data, meta)
        if len(index) == 0:
            return
        ref = self.buffer.put.remote(index, tensors_to_wire(tensors), meta_arrays, peer_id(), *self._here())
        call([ref], self.spec.rpc_timeout_s, f"put of {len(index)} samples")

    def get(self, request: DockRequest) -> DockBatch:
        consumer = request.consumer
        what = f"get by consumer {consumer!r}"
        columns = request.columns
        if columns is None:
            if consumer not in self._columns:
                ref = self.buffer.columns.remote(consumer)
                self._columns[consumer] = tuple(call([ref], self.spec.rpc_timeout_s, what)[0])
            columns = self._columns[consumer]
        win = validation.check_window(self.spec, request.window, f"get by {consumer!r}")
        timeout = self.spec.get_timeout_s if request.timeout_s is None else request.timeout_s
        request = request.resolved(columns, win, timeout)
        validation.check_get(self.spec, request)
        ref = self.buffer.get.remote(request, peer_id(), *self._here())
        status, indices, arrays, meta = call([ref], timeout + _GRACE_S, what)[0]
        if status != "ok":
            raise get_failure(status, indices)
        data = {c: from_wire(arrays[c], self.spec.columns[c]).clone() for c in request.columns}
        return DockBatch(
            indices=indices.tolist(),
            data=TensorDict(data, batch_size=[len(indices)]),
            meta={k: torch.from_numpy(v) for k, v in meta.items()},
        )

    def _here(self) -> tuple[str, ...]:
        """Under the network model, this process's node (the buffer charges its link when the caller is elsewhere);
        otherwise nothing, and the calls are exactly the unmodelled ones."""
        return (placement.current_node(),) if self.link is not None else ()

    def reset(self, keep: Sequence[int] = (), window: tuple[int, int] | None = None) -> None:
        kept, win = validation.check_reset(self.spec, keep, window)
        call([self.buffer.reset.remote(kept, win)], self.spec.rpc_timeout_s, "reset")

    def stats(self) -> dict[str, Any]:
        buffer = call([self.buffer.stats.remote()], self.spec.rpc_timeout_s, "stats")[0]
        controllers = buffer.pop("controllers")
        return {
            "backend": "centralized",
            "capacity": self.spec.capacity,
            "group_size": self.spec.group_size,
            "buffer": buffer,
            "controllers": controllers,
            "puts": buffer["writes"],
            "gets": sum(c["gets"] for c in controllers.values()),
            "busiest_bytes": buffer["bytes_in"] + buffer["bytes_out"],
        }

    def shutdown(self) -> None:
        ray.kill(self.buffer, no_restart=True)
        if self.link is not None:
            remove_links(self.link.key)
