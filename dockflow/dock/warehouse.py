"""A warehouse's storage: the column data of its shard of samples, in preallocated numpy arrays.

Pure Python + numpy (no torch, so dock processes start fast; columns arrive in their wire dtype, see
``wire.py``). The dock node part wrapping it is in ``node_parts.py``; the centralized buffer uses one store for
the whole batch. A column's per-sample shape is fixed by its first write after a reset that kept nothing, and
enforced afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dockflow.dock.errors import DockError, DockInvalid
from dockflow.dock.meta import MetaTable
from dockflow.dock.sharding import ShardMap
from dockflow.dock.window import Window, dropped_mask


class WarehouseStore:
    """Column data, readiness and metadata of the samples owned by shard ``shard`` of ``shard_map``."""

    def __init__(self, columns: Mapping[str, np.dtype | str], shard_map: ShardMap, shard: int = 0) -> None:
        self.dtypes = {c: np.dtype(d) for c, d in columns.items()}
        self.shard_map = shard_map
        self.shard = shard
        self.owned = shard_map.owned(shard)
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.data: dict[str, np.ndarray] = {}
        self.ready = {c: np.zeros(shard_map.capacity, dtype=bool) for c in self.dtypes}
        self.meta = MetaTable(shard_map.capacity, shard_map.group_size)
        self.bytes_in = 0
        self.bytes_out = 0
        self.writes = 0
        self.reads = 0

    def _check_owned(self, indices: np.ndarray) -> None:
        foreign = indices[self.shard_map.owner(indices) != self.shard]
        if len(foreign):
            raise DockInvalid(f"warehouse {self.shard} does not own indices {foreign[:8].tolist()}")

    def fix_shape(self, column: str, shape: tuple[int, ...]) -> None:
        """Fix the per-sample shape of a column (allocating its storage) unless it is already fixed."""
        if column in self.shapes:
            return
        self.shapes[column] = tuple(shape)
        self.data[column] = np.empty((len(self.owned), *shape), dtype=self.dtypes[column])

    def write(
        self,
        indices: np.ndarray,
        arrays: Mapping[str, np.ndarray],
        meta: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """Store rows ``arrays[c][k]`` for sample ``indices[k]``; check dtype and per-sample shape first."""
        self._check_owned(indices)
        for column, array in arrays.items():
            if column not in self.dtypes:
                raise DockInvalid(f"unknown column {column!r}; the dock has {list(self.dtypes)}")
            if array.dtype != self.dtypes[column]:
                raise DockInvalid(f"column {column!r}: dtype {array.dtype}, the dock holds {self.dtypes[column]}")
            if array.shape[:1] != (len(indices),):
                raise DockInvalid(f"column {column!r}: {array.shape[:1]} rows for {len(indices)} indices")
            shape = tuple(array.shape[1:])
            expected = self.shapes.get(column, shape)
            if shape != expected:
                raise DockInvalid(
                    f"column {column!r}: per-sample shape {list(shape)}, but this iteration it is "
                    f"{list(expected)} (fixed by the first put after reset)"
                )
        slots = self.shard_map.local_slot(indices)
        for column, array in arrays.items():
            self.fix_shape(column, tuple(array.shape[1:]))
            self.data[column][slots] = array
            self.ready[column][indices] = True
            self.bytes_in += array.nbytes
        if meta:
            self.meta.update(indices, meta)
        self.writes += 1

    def read(self, indices: np.ndarray, columns: Sequence[str]) -> dict[str, np.ndarray]:
        """Copies of the rows of ``indices`` for ``columns`` (every one must be ready)."""
        self._check_owned(indices)
        slots = self.shard_map.local_slot(indices)
        out = {}
        for column in columns:
            if column not in self.dtypes:
                raise DockInvalid(f"unknown column {column!r}; the dock has {list(self.dtypes)}")
            missing = indices[~self.ready[column][indices]]
            if len(missing):
                raise DockError(f"warehouse {self.shard}: column {column!r} not written for {missing[:8].tolist()}")
            out[column] = self.data[column][slots]
            self.bytes_out += out[column].nbytes
        self.reads += 1
        return out

    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Ready indices per column and metadata of owned samples: what a newly added controller needs."""
        ready = {c: self.owned[bitmap[self.owned]] for c, bitmap in self.ready.items()}
        return ready, self.meta.take(self.owned)

    def reset(self, keep: np.ndarray, window: Window | None = None) -> None:
        """Drop readiness of everything in ``window`` (default: all) not in ``keep``; free storage and shapes
        when the whole dock is reset and nothing is kept."""
        dropped = dropped_mask(self.shard_map.capacity, keep, window)
        for bitmap in self.ready.values():
            bitmap[dropped] = False
        self.meta.reset(keep, window)
        if len(keep) == 0 and window is None:
            self.shapes.clear()
            self.data.clear()

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.data.values())
