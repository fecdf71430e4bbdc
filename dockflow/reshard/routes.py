"""The resharding plan of one rank: per parameter, who holds which update pieces and what generation needs;
then the allgather buckets. Pure bookkeeping, no communication: every rank computes the same buckets for
the groups it shares with others, which keeps the collectives in step.

A route's ``members`` are the update-layout ranks (this rank among them) whose shards together make one
full copy of the parameter (its TP group, its TP x EP group for experts, its DP / stage group under FSDP;
with pipeline stages its PP group for a replicated parameter, its TP x PP group for a TP-split one, where
the members on other stages hold none of it).
Allgathering inside that group gives this rank every element, so any generation layout can be served.
Buckets are built per group kind, in a fixed kind order, so no two ranks can wait on each other's groups
in opposite orders. A bucket is one flat byte buffer of ``slot_bytes`` per member; a parameter too large
for a bucket is split into row ranges of the members' local tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch

from dockflow.reshard.blocks import BlockMap
from dockflow.reshard.layout import ParallelLayout
from dockflow.reshard.rules import ModelPartition

ALIGN = 64  # byte alignment of every piece in a bucket, so each can be viewed as its dtype
KIND_ORDER = ("tp", "dp", "tp_ep", "stage", "pp", "tp_pp")


@dataclass(frozen=True)
class Route:
    """One parameter as this rank sees it: the holders of one full copy and what this rank must end with."""

    name: str
    dtype: torch.dtype
    holders: str | None  # group kind of ``members``; None: this rank's own shard is the full copy
    members: tuple[int, ...]
    pieces: tuple[BlockMap | None, ...]  # each member's update shard (None: holds none of it)
    gen: BlockMap | None  # this rank's generation shard (None: needs none of it)
    me: int  # this rank's index in ``members``

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def data_rows(self, member: int) -> int:
        """Rows of member's local tensor that hold data (FSDP padding rows excluded)."""
        piece = self.pieces[member]
        if piece is None or not piece.blocks:
            return 0
        return max(b.local_start[0] + b.extent[0] for b in piece.blocks)

    def row_bytes(self, member: int) -> int:
        piece = self.pieces[member]
        return 0 if piece is None else prod(piece.local_shape[1:]) * self.itemsize


@dataclass(frozen=True)
class Item:
    """Rows ``rows[m] = (start, stop)`` of each member's local tensor of one route, at ``offsets[m]`` in its slot."""

    route: Route
    rows: tuple[tuple[int, int], ...]
    offsets: tuple[int, ...]

    def nbytes(self, member: int) -> int:
        start, stop = self.rows[member]
        return (stop - start) * self.route.row_bytes(member)


@dataclass(frozen=True)
class Bucket:
    """One allgather: ``len(members)`` slots of ``slot_bytes``, each member's pieces packed in its slot."""

    holders: str
    members: tuple[int, ...]
    slot_bytes: int
    items: tuple[Item, ...]

    @property
    def nbytes(self) -> int:
        return self.slot_bytes * len(self.members)


def plan_routes(partition: ModelPartition, update: ParallelLayout, gen: ParallelLayout, rank: int) -> list[Route]:
    """The route of every parameter for ``rank`` (ranks of the update and generation layouts coincide)."""
    if update.size != gen.size:
        raise ValueError(f"update layout {update} spans {update.size} ranks, generation layout {gen} spans "
                         f"{gen.size}: resharding needs both on the same ranks")
    routes = []
    for name, meta in partition.meta.items():
        holders = partition.holders_kind(name, update)
        members = tuple(update.group_of(holders, rank)) if holders else (rank,)
        if len(members) == 1:
            holders = None
        pieces = tuple(partition.shard_map(name, update, m) for m in members)
        routes.append(Route(name, meta.dtype, holders, members, pieces,
                            partition.shard_map(name, gen, rank), members.index(rank)))
    return routes


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _chunk_count(route: Route, bucket_bytes: int) -> int:
    """Fewest row chunks per member that fit one chunk of every member in one bucket."""
    size = len(route.members)
    cap = bucket_bytes // size - (ALIGN - 1)
    chunks = 1
    for m in range(size):
        rows, row_bytes = route.data_rows(m), route.row_bytes(m)
        if rows == 0 or row_bytes == 0:
            continue
        if row_bytes > cap:
            raise ValueError(f"bucket_bytes={bucket_bytes} is too small: one row of {route.name!r} "
                             f"({row_bytes} bytes) from each of {size} ranks needs at least "
                             f"{size * (row_bytes + ALIGN - 1)} bytes")
        chunks = max(chunks, -(-rows // (cap // row_bytes)))
    return chunks


def _chunks(route: Route, bucket_bytes: int | None) -> list[tuple[tuple[int, int], ...]]:
    """Row ranges per member, one tuple per chunk."""
    size = len(route.members)
    count = 1 if bucket_bytes is None else _chunk_count(route, bucket_bytes)
    out = []
    for j in range(count):
        rows = []
        for m in range(size):
            total = route.data_rows(m)
            step = -(-total // count) if total else 0
            start = min(j * step, total)
            rows.append((start, min(start + step, total)))
        out.append(tuple(rows))
    return out


def plan_buckets(routes: list[Route], bucket_bytes: int | None) -> list[Bucket]:
    """Allgather buckets for the routes that need communication; ``bucket_bytes=None``: one per parameter."""
    if bucket_bytes is not None and bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive or None, got {bucket_bytes}")
    buckets: list[Bucket] = []
    for kind in KIND_ORDER:
        kind_routes = [r for r in routes if r.holders == kind]
        if kind_routes:
            buckets.extend(_kind_buckets(kind, kind_routes, bucket_bytes))
    return buckets


def _kind_buckets(kind: str, routes: list[Route], bucket_bytes: int | None) -> list[Bucket]:
    """Greedy packing of one group kind's routes (all with the same members) in parameter order."""
    members = routes[0].members
    size = len(members)
    out: list[Bucket] = []
    items: list[Item] = []
    used = [0] * size
    for route in routes:
        for rows in _chunks(route, bucket_bytes):
            item = Item(route, rows, tuple(_align(u) for u in used))
            after = [off + item.nbytes(m) for m, off in enumerate(item.offsets)]
            if bucket_bytes is not None and items and _align(max(after)) * size > bucket_bytes:
                out.append(Bucket(kind, members, _align(max(used)) or ALIGN, tuple(items)))
                items = []
                item = Item(route, rows, (0,) * size)
                after = [item.nbytes(m) for m in range(size)]
            items.append(item)
            used = after
        if bucket_bytes is None:
            out.append(Bucket(kind, members, _align(max(used)) or ALIGN, tuple(items)))
            items, used = [], [0] * size
    if items:
        out.append(Bucket(kind, members, _align(max(used)) or ALIGN, tuple(items)))
    return out
