"""Run a resharding plan: allocate this rank's generation weights, then fill them bucket by bucket from
allgathers inside the update layout's groups (or straight from the local shard where no other rank is
needed). Shared by the naive method and allgather-swap; they differ in bucketing, aliasing and the swap.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dockflow.reshard.blocks import BlockMap, copy_overlap
from dockflow.reshard.layout import ParallelLayout
from dockflow.reshard.ledger import MemoryLedger
from dockflow.reshard.process_groups import ReshardGroups
from dockflow.reshard.routes import Bucket, Route, plan_buckets, plan_routes
from dockflow.reshard.rules import ModelPartition
from dockflow.reshard.swap import HostSwap

# all_gather_single is the torch >= 2.13 name of all_gather_into_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class ReshardResult:
    """This rank's generation weights and what it cost."""

    method: str
    generation_weights: dict[str, torch.Tensor]
    reshard_s: float
    temp_peak_bytes: int
    bucket_bytes: int | None
    buckets: int
    swap: HostSwap | None = None
    swap_s: float = 0.0
    aliased: list[str] = field(default_factory=list)  # generation weights that are update tensors (naive)

    def release_generation(self, ledger: MemoryLedger | None = None) -> None:
        """Drop the generation weights (before the next update); the ledger stops counting them."""
        self.generation_weights.clear()
        if ledger is not None:
            ledger.clear("generation_weights")


def check_layouts(update: ParallelLayout, gen: ParallelLayout, groups: ReshardGroups) -> None:
    """Both layouts on the same ranks, groups built for the update layout."""
    if groups.layout != update:
        raise ValueError(f"ReshardGroups were built for layout {groups.layout}, the update layout is {update}")
    if gen.size != update.size:
        raise ValueError(f"update layout {update} spans {update.size} ranks, generation layout {gen} {gen.size}")


def _local(weights: Mapping[str, torch.Tensor], route: Route) -> torch.Tensor | None:
    """This rank's update tensor of ``route``, checked against the map its layout implies."""
    piece = route.pieces[route.me]
    tensor = weights.get(route.name)
    if piece is None:
        return None
    if tensor is None:
        raise ValueError(f"update weights lack {route.name!r}, which this rank holds in the update layout")
    rows = route.data_rows(route.me)
    if tuple(tensor.shape[1:]) != piece.local_shape[1:] or not rows <= tensor.shape[0] <= piece.local_shape[0]:
        raise ValueError(f"update shard of {route.name!r} has shape {tuple(tensor.shape)}; the update layout "
                         f"gives this rank {piece.local_shape} (at least {rows} rows)")
    return tensor


def allocate_generation(routes: list[Route], weights: Mapping[str, torch.Tensor], device: torch.device,
                        alias: bool) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Empty generation tensors (zeros where padded); with ``alias``, reuse an update tensor that already
    is exactly the generation shard (the naive method's in-place use of common weights)."""
    out: dict[str, torch.Tensor] = {}
    aliased = []
    for route in routes:
        if route.gen is None:
            continue
        local = _local(weights, route)
        view = _as_view(local, route.pieces[route.me], route.gen) if alias and local is not None else None
        if view is not None:
            out[route.name] = view
            aliased.append(route.name)
            continue
        make = torch.zeros if route.gen.padded else torch.empty
        out[route.name] = make(route.gen.local_shape, dtype=route.dtype, device=device)
    return out, aliased


def _as_view(local: torch.Tensor, piece: BlockMap | None, gen: BlockMap) -> torch.Tensor | None:
    """``local`` or a dim-0 range of it when that is exactly the generation shard (e.g. the experts this
    rank keeps serving), else None."""
    if piece is None or gen.padded or not gen.blocks:
        return None
    if piece == gen and tuple(local.shape) == gen.local_shape:
        return local
    rows = gen.local_shape[0]
    first = gen.blocks[0]
    for block in piece.blocks:
        if not all(f <= g < f + e for f, g, e in zip(block.full_start, first.full_start, block.extent, strict=True)):
            continue
        start = block.local_start[0] + first.full_start[0] - block.full_start[0] - first.local_start[0]
        if 0 <= start and start + rows <= local.shape[0] and piece.narrow(0, start, rows) == gen:
            return local[start:start + rows]
    return None


def pack_bucket(bucket: Bucket, slot: torch.Tensor, weights: Mapping[str, torch.Tensor], me: int) -> None:
    """Copy member ``me``'s rows of every item into its slot of the bucket buffer."""
    for item in bucket.items:
        start, stop = item.rows[me]
        if stop <= start:
            continue
        local = _local(weights, item.route)
        assert local is not None
        data = local[start:stop].contiguous().reshape(-1).view(torch.uint8)
        slot[item.offsets[me]:item.offsets[me] + data.numel()].copy_(data)


def unpack_bucket(bucket: Bucket, buffer: torch.Tensor, generation: dict[str, torch.Tensor], skip: set[str]) -> None:
    """Copy what this rank's generation shards need out of a gathered bucket (names in ``skip`` are aliases)."""
    for item in bucket.items:
        route = item.route
        if route.gen is None or route.name in skip:
            continue
        for m in range(len(bucket.members)):
            start, stop = item.rows[m]
            piece_map = route.pieces[m]
            if stop <= start or piece_map is None:
                continue
            begin = m * bucket.slot_bytes + item.offsets[m]
            raw = buffer[begin:begin + item.nbytes(m)]
            piece = raw.view(route.dtype).view((stop - start,) + piece_map.local_shape[1:])
            copy_overlap(generation[route.name], route.gen, piece, piece_map.narrow(0, start, stop - start))


def copy_local(routes: list[Route], weights: Mapping[str, torch.Tensor], generation: dict[str, torch.Tensor],
               skip: set[str]) -> None:
    """Fill the generation shards whose full copy is this rank's own update shard (no communication)."""
    for route in routes:
        if route.holders is None and route.gen is not None and route.name not in skip:
            local = _local(weights, route)
            piece_map = route.pieces[route.me]
            assert local is not None and piece_map is not None
            copy_overlap(generation[route.name], route.gen, local, piece_map)


def run_reshard(method: str, weights: Mapping[str, torch.Tensor], partition: ModelPartition,
                update: ParallelLayout, gen: ParallelLayout, groups: ReshardGroups, *,
                bucket_bytes: int | None, alias: bool, device: torch.device,
                ledger: MemoryLedger | None) -> ReshardResult:
    """Gather ``weights`` (this rank's update shards) into this rank's generation shards."""
    check_layouts(update, gen, groups)
    started = time.perf_counter()
    routes = plan_routes(partition, update, gen, groups.rank)
    buckets = plan_buckets(routes, bucket_bytes)
    with torch.no_grad():
        generation, aliased = allocate_generation(routes, weights, device, alias)
        skip = set(aliased)
        if ledger is not None:
            ledger.track("generation_weights", generation)
            ledger.record("allocated", phase="reshard")
        copy_local(routes, weights, generation, skip)
        temp_peak = 0
        for index, bucket in enumerate(buckets):
            buffer = torch.empty(bucket.nbytes, dtype=torch.uint8, device=device)
            me = bucket.members.index(groups.rank)
            slot = buffer[me * bucket.slot_bytes:(me + 1) * bucket.slot_bytes]
            pack_bucket(bucket, slot, weights, me)
            _all_gather(buffer, slot, group=groups.get(bucket.members))
            if ledger is not None:
                ledger.track("temp_buffer", [buffer])
                ledger.record(f"bucket {index} ({bucket.holders})", phase="reshard")
            temp_peak = max(temp_peak, buffer.numel())
            unpack_bucket(bucket, buffer, generation, skip)
            del slot, buffer
            if ledger is not None:
                ledger.clear("temp_buffer")
    if device.type != "cpu":
        torch.accelerator.synchronize(device)
    seconds = time.perf_counter() - started
    if ledger is not None:
        ledger.record("gathered", phase="reshard")
    return ReshardResult(method, generation, seconds, temp_peak, bucket_bytes, len(buckets), aliased=aliased)
