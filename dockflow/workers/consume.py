"""The loop every worker state runs: take ready batches from the dock until its share is consumed."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from dockflow.dock import DockBatch, TransferDock


@dataclass
class WaitClock:
    """Seconds a worker spent waiting on the dock for ready samples (idle, not working)."""

    seconds: float = 0.0


def consume(
    dock: TransferDock,
    consumer: str,
    columns: Sequence[str],
    total: int,
    batch_size: int,
    *,
    whole_groups: bool = False,
    window: tuple[int, int] | None = None,
    clock: WaitClock | None = None,
    dp_share: tuple[int, int] | None = None,
) -> Iterator[DockBatch]:
    """Yield batches of ``batch_size`` (the last may be smaller) until ``total`` samples are consumed, from the
    iteration's ``window`` of the dock; ``clock`` adds up the time spent waiting for them. ``dp_share=(rank,
    ranks)``: each batch is this rank's length-balanced share of a mini-batch (``TransferDock.get``)."""
    taken = 0
    while taken < total:
        size = min(batch_size, total - taken)
        start = time.perf_counter()
        batch = dock.get(consumer, size, columns, whole_groups=whole_groups, window=window, dp_share=dp_share)
        if clock is not None:
            clock.seconds += time.perf_counter() - start
        taken += len(batch)
        yield batch
