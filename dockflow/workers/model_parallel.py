"""The actor's model-parallel ranks (``train.engine: megatron``, TP x PP): one model split over several workers,
every one of which must run the same batches. Rank 0 alone reads the dock and writes the results; it passes
each batch to the others over the actor's process group, and a ``None`` after the last one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

import torch.distributed as dist

T = TypeVar("T")


def shared_stream(items: Iterable[T] | None, reader: bool) -> Iterator[T]:
    """On the reader (actor rank 0): ``items``, each also broadcast to the other ranks; on them (``items`` None):
    the reader's items as they arrive. Every rank must iterate to the end (collective); the process group's
    timeout (``train.stage_timeout_s``) bounds each wait."""
    if reader:
        assert items is not None
        for item in items:
            dist.broadcast_object_list([item], src=0)
            yield item
        dist.broadcast_object_list([None], src=0)
        return
    while True:
        box: list[T | None] = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:
            return
        yield box[0]
