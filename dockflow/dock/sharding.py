"""Which warehouse owns which sample: blocks of ``block`` samples (whole groups) are dealt round-robin over
the S warehouses.

Whole groups stay in one warehouse (a GRPO group is read from one place). With ``block == group_size``
consecutive groups go to different warehouses, so one large get reads from all warehouses in parallel; with
``block`` equal to the workers' micro-batch, each micro-batch put or get is served by one warehouse (fewer
messages) while consecutive micro-batches still spread over all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ShardMap:
    """Maps global sample indices to (warehouse, local slot) for ``num_shards`` warehouses."""

    capacity: int
    group_size: int
    num_shards: int
    block: int = 0  # samples per dealt block, a multiple of group_size; 0 means group_size

    @property
    def block_size(self) -> int:
        return self.block or self.group_size

    def owner(self, indices: np.ndarray) -> np.ndarray:
        """Warehouse index of each global index."""
        return (indices // self.block_size) % self.num_shards

    def local_slot(self, indices: np.ndarray) -> np.ndarray:
        """Row of each global index inside its owning warehouse."""
        block = indices // self.block_size
        return (block // self.num_shards) * self.block_size + indices % self.block_size

    def owned(self, shard: int) -> np.ndarray:
        """All global indices a warehouse owns, ascending."""
        everything = np.arange(self.capacity, dtype=np.int64)
        return everything[self.owner(everything) == shard]

    def split(self, indices: np.ndarray) -> dict[int, np.ndarray]:
        """Positions (into ``indices``) per owning warehouse, each in the original order."""
        owners = self.owner(indices)
        if self.num_shards == 1:
            return {0: np.arange(len(indices))}
        return {int(s): np.flatnonzero(owners == s) for s in np.unique(owners)}
