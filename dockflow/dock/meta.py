"""Per-sample metadata table (prompt id, response length, policy version, age), kept by warehouses and
controllers alike: a few int64 scalars per sample, the only thing that moves instead of data."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dockflow.dock.errors import META_KEYS
from dockflow.dock.window import Window, dropped_mask


class MetaTable:
    """int64 metadata for ``capacity`` samples, with defaults for samples nobody described."""

    def __init__(self, capacity: int, group_size: int) -> None:
        self.capacity = capacity
        self.group_size = group_size
        self.values = {key: np.empty(capacity, dtype=np.int64) for key in META_KEYS}
        self._fill_defaults(np.arange(capacity, dtype=np.int64))

    def _fill_defaults(self, indices: np.ndarray) -> None:
        self.values["prompt_id"][indices] = indices // self.group_size
        self.values["response_length"][indices] = -1  # unknown until a producer says
        self.values["policy_version"][indices] = -1
        self.values["age"][indices] = 0

    def update(self, indices: np.ndarray, meta: Mapping[str, np.ndarray]) -> None:
        for key, values in meta.items():
            self.values[key][indices] = values

    def take(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        return {key: column[indices] for key, column in self.values.items()}

    def reset(self, keep: np.ndarray, window: Window | None = None) -> None:
        """Defaults for everything in ``window`` (default: all) not kept; kept samples grow one iteration older."""
        self._fill_defaults(np.flatnonzero(dropped_mask(self.capacity, keep, window)))
        self.values["age"][keep] += 1
