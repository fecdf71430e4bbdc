"""Which warehouse owns which sample: groups are dealt round-robin over the S warehouses.

Whole groups stay in one warehouse (a GRPO group is read from one place), and consecutive groups go to
different warehouses, so a get of the lowest-indexed samples reads from all warehouses in parallel.
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

    def owner(self, indices: np.ndarray) -> np.ndarray:
        """Warehouse index of each global index."""
        return (indices // self.group_size) % self.num_shards

    def local_slot(self, indices: np.ndarray) -> np.ndarray:
        """Row of each global index inside its owning warehouse."""
        group = indices // self.group_size
        return (group // self.num_shards) * self.group_size + indices % self.group_size

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
