"""The loop every worker state runs: take ready batches from the dock until its share is consumed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from dockflow.dock import DockBatch, DockRequest, TransferDock


@dataclass
class WaitClock:
    """Seconds a worker spent waiting on the dock for ready samples (idle, not working)."""

    seconds: float = 0.0


def consume(dock: TransferDock, request: DockRequest, total: int, clock: WaitClock | None = None) -> Iterator[DockBatch]:
    """Yield batches of ``request.batch_size`` (the last may be smaller) until ``total`` samples are consumed;
    ``clock`` adds up the time spent waiting for them."""
    taken = 0
    while taken < total:
        start = time.perf_counter()
        batch = dock.get(request.sized(min(request.batch_size, total - taken)))
        if clock is not None:
            clock.seconds += time.perf_counter() - start
        taken += len(batch)
        yield batch
