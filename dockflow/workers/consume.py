"""The loop every worker state runs: take ready batches from the dock until its share is consumed, compute the
state's column for each, put it back.

    seconds = fill_column(dock, consume(dock, request, total), "ref_log_prob", lambda batch: logp_of(batch))

The reference, the reward model, the critic's values, the actor's old log-probs and the reward worker's rewards
are each this loop with their own ``compute``; what differs between them is only what they compute."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from tensordict import TensorDict

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


def fill_column(dock: TransferDock, batches: Iterable[DockBatch], column: str,
                compute: Callable[[DockBatch], torch.Tensor], writes: bool = True) -> float:
    """For each of ``batches`` (``consume``'s, or a megatron model group's shared stream of them), ``compute`` the
    column ``column`` and put it into the dock at the batch's indices; ``writes=False``: a rank that computes with
    its group but whose group's reader writes. Returns the seconds the loop took, waits included."""
    start = time.perf_counter()
    for batch in batches:
        values = compute(batch)
        if writes:
            dock.put(batch.indices, TensorDict({column: values}, batch_size=[len(batch)]))
    return time.perf_counter() - start
