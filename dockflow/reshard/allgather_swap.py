"""Allgather-swap (the paper's Fig. 5): reshard without leaving update state on the device.

1. allgather the update weights in buckets of ``bucket_bytes`` into one temporary buffer (at most one
   bucket alive at a time);
2. copy from it the slices this rank's generation layout needs into new generation weights;
3. swap the update weights, grads and optimizer state to host memory, releasing their device storage;
4. free the temporary buffer (each bucket's, as soon as it is unpacked).

Before the next update ``result.swap.swap_back()`` restores the update state bit-identically;
``result.swap.start_swap_back()`` starts it in a background thread so it can overlap inference.
"""

from __future__ import annotations

from dockflow.reshard.gather import ReshardResult, run_reshard
from dockflow.reshard.host_arena import PinnedArena
from dockflow.reshard.layout import ParallelLayout
from dockflow.reshard.ledger import MemoryLedger
from dockflow.reshard.process_groups import ReshardGroups
from dockflow.reshard.rules import ModelPartition
from dockflow.reshard.state import UpdateState
from dockflow.reshard.swap import HostSwap

DEFAULT_BUCKET_BYTES = 64 * 1024 * 1024


def allgather_swap(state: UpdateState, partition: ModelPartition, update: ParallelLayout, gen: ParallelLayout,
                   groups: ReshardGroups, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                   ledger: MemoryLedger | None = None, pin_memory: bool | None = None,
                   arena: PinnedArena | None = None) -> ReshardResult:
    """This rank's generation weights; the update state is on the host until ``result.swap.swap_back()``
    (in ``arena``'s pinned bytes when given: an engine's, reused every iteration)."""
    device = state.device
    if ledger is not None:
        state.track(ledger)
        ledger.record("start", phase="reshard")
    result = run_reshard("allgather_swap", state.local_weights(), partition, update, gen, groups,
                         bucket_bytes=bucket_bytes, alias=False, device=device, ledger=ledger)
    result.swap = HostSwap.swap_out(state.all_tensors(), device, pin_memory=pin_memory, arena=arena)
    result.swap_s = result.swap.swap_out_s
    if ledger is not None:
        ledger.record("swapped", phase="reshard")
        ledger.record("ready", phase="generation")
    return result
