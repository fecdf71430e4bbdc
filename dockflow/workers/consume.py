"""The loop every worker state runs: take ready batches from the dock until its share is consumed."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from dockflow.dock import DockBatch, TransferDock


def consume(
    dock: TransferDock,
    consumer: str,
    columns: Sequence[str],
    total: int,
    batch_size: int,
    *,
    whole_groups: bool = False,
    window: tuple[int, int] | None = None,
) -> Iterator[DockBatch]:
    """Yield batches of ``batch_size`` (the last may be smaller) until ``total`` samples are consumed, from the
    iteration's ``window`` of the dock."""
    taken = 0
    while taken < total:
        size = min(batch_size, total - taken)
        batch = dock.get(consumer, size, columns, whole_groups=whole_groups, window=window)
        taken += len(batch)
        yield batch
