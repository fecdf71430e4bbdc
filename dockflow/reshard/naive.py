"""Naive resharding (the paper's Fig. 3): new buffers for the generation weights beside the update state.

The update weights, grads and optimizer state stay on the device through generation. Generation weights
that equal this rank's update shard (replicated weights, an expert this rank already holds whole) are used
in place; every other one gets a new buffer filled by a per-parameter allgather. What stays behind and is
not used by generation -- the TP shards of the update layout and the experts this rank no longer serves --
is the redundant memory of Eq. (3) (``redundancy.py``).
"""

from __future__ import annotations

from dockflow.reshard.gather import ReshardResult, run_reshard
from dockflow.reshard.layout import ParallelLayout
from dockflow.reshard.ledger import MemoryLedger
from dockflow.reshard.process_groups import ReshardGroups
from dockflow.reshard.rules import ModelPartition
from dockflow.reshard.state import UpdateState


def naive_reshard(state: UpdateState, partition: ModelPartition, update: ParallelLayout, gen: ParallelLayout,
                  groups: ReshardGroups, *, ledger: MemoryLedger | None = None) -> ReshardResult:
    """This rank's generation weights; the update state is left as it is (nothing to swap back)."""
    if ledger is not None:
        state.track(ledger)
        ledger.record("start", phase="reshard")
    result = run_reshard("naive", state.local_weights(), partition, update, gen, groups, bucket_bytes=None,
                         alias=True, device=state.device, ledger=ledger)
    if ledger is not None:
        ledger.record("ready", phase="generation")
    return result

