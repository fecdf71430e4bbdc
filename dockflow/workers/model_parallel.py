"""Which batches each rank of a model-parallel worker set runs (``train.engine: megatron``: train.dp replicas of a
train.tp x train.pp model, one worker per rank; the FSDP2 actor is the case tp = pp = 1).

Ranks are numbered as megatron numbers them (tensor parallel fastest, then data parallel, then pipeline:
``dockflow.reshard.ParallelLayout``). The ranks of one replica (its model group) must run the same batches: the
group's first rank alone reads the dock, for its replica's share of every batch, and writes the results; it passes
each batch to its peers over the group (``shared_stream``), and a ``None`` after the last one. Each replica reads
its own share (``ModelReplica.index`` of ``dp``), so the dock hands every sample to exactly one replica.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

import torch.distributed as dist

from dockflow.reshard import ParallelLayout

T = TypeVar("T")


@dataclass(frozen=True)
class ModelReplica:
    """Where worker ``rank`` sits among ``dp`` replicas of a ``tp`` x ``pp`` model."""

    rank: int
    tp: int = 1
    pp: int = 1
    dp: int = 1

    @cached_property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(tp=self.tp, pp=self.pp, dp=self.dp)

    @property
    def index(self) -> int:
        """Its replica (data-parallel rank): which share of each batch its model group takes from the dock."""
        return self.layout.coords(self.rank).dp

    @property
    def peers(self) -> list[int]:
        """The ranks of its model group (TP x PP), the reader first."""
        return self.layout.group_of("tp_pp", self.rank)

    @property
    def readers(self) -> list[int]:
        """The reader of each model group, in replica order."""
        return [self.layout.rank_of(pp=0, dp=d, tp=0) for d in range(self.dp)]

    @property
    def reads_dock(self) -> bool:
        """Whether this rank reads the dock (and writes results) for its model group."""
        return self.peers[0] == self.rank

    @property
    def shares_batches(self) -> bool:
        """Whether its model group has several ranks, which then run the reader's batches (``shared_stream``)."""
        return self.tp * self.pp > 1


def model_group(replica: ModelReplica) -> Any:
    """The process group of ``replica``'s model group for ``shared_stream``: None when it is the whole world (the
    default group) or one rank (no batch to share); else every model group is created, on every rank in the same
    order (collective: call it on every rank, once, after the default group is formed)."""
    if replica.dp == 1 or not replica.shares_batches:
        return None
    mine = None
    for ranks in replica.layout.groups("tp_pp"):
        group = dist.new_group(ranks)
        if replica.rank in ranks:
            mine = group
    return mine


def shared_stream(items: Iterable[T] | None, reader: bool, group: Any = None, src: int = 0) -> Iterator[T]:
    """On the reader (global rank ``src`` of ``group``; None = the default group): ``items``, each also broadcast to
    the group's other ranks; on them (``items`` None): the reader's items as they arrive. Every rank of the group
    must iterate to the end (collective); the process group's timeout (``train.stage_timeout_s``) bounds each
    wait."""
    if reader:
        assert items is not None
        for item in items:
            dist.broadcast_object_list([item], src=src, group=group)
            yield item
        dist.broadcast_object_list([None], src=src, group=group)
        return
    while True:
        box: list[T | None] = [None]
        dist.broadcast_object_list(box, src=src, group=group)
        if box[0] is None:
            return
        yield box[0]


def from_readers(item: T | None, replica: ModelReplica) -> list[T]:
    """The readers' ``item``s, one per replica in replica order (the other ranks pass None): on every rank with
    several replicas (collective over the default group), else the reader's own (``[]`` on its peers)."""
    if replica.dp == 1:
        return [item] if replica.reads_dock and item is not None else []
    items: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(items, item if replica.reads_dock else None)
    return [items[r] for r in replica.readers]
