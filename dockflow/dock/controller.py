"""A controller's bookkeeping for one consumer (worker state): which (sample, column) pairs are ready, which
samples the consumer already took, and their metadata. Pure Python + numpy; the Ray actor wrapping it is
in ``actors.py`` and the centralized buffer reuses it as is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dockflow.dock.errors import DockInvalid
from dockflow.dock.meta import MetaTable


@dataclass(frozen=True)
class Readiness:
    """Why a request is not satisfiable yet: what a DockTimeout reports."""

    consumer: str
    columns: tuple[str, ...]
    batch_size: int
    whole_groups: bool
    ready: int  # unconsumed samples (or whole-group samples) with every requested column ready
    missing: dict[str, int]  # per requested column: unconsumed samples still lacking it
    consumed: int

    def message(self, waited_s: float) -> str:
        unit = "samples in complete groups" if self.whole_groups else "samples"
        lacking = ", ".join(f"{c} (missing for {n})" for c, n in self.missing.items() if n) or "none"
        return (
            f"consumer {self.consumer!r} waited {waited_s:.1f}s for {self.batch_size} samples with columns "
            f"{list(self.columns)}, but only {self.ready} {unit} were ready and unconsumed "
            f"({self.consumed} already consumed); columns not ready: {lacking}"
        )


class ControllerState:
    """Ready bitmaps per column, a consumed bitmap and metadata for the ``capacity`` samples of a dock."""

    def __init__(
        self,
        consumer: str,
        all_columns: Sequence[str],
        capacity: int,
        group_size: int = 1,
        columns: Sequence[str] | None = None,
    ) -> None:
        if capacity % group_size:
            raise DockInvalid(f"capacity {capacity} is not a multiple of group_size {group_size}")
        self.consumer = consumer
        self.capacity = capacity
        self.group_size = group_size
        self.all_columns = tuple(all_columns)
        self.columns = tuple(columns) if columns else self.all_columns
        self._check_columns(self.columns)
        self.ready = {c: np.zeros(capacity, dtype=bool) for c in self.all_columns}
        self.consumed = np.zeros(capacity, dtype=bool)
        self.meta = MetaTable(capacity, group_size)
        self.gets = 0
        self.samples_out = 0
        self.notifications = 0

    def _check_columns(self, columns: Sequence[str]) -> None:
        unknown = [c for c in columns if c not in self.all_columns]
        if unknown:
            raise DockInvalid(f"unknown columns {unknown}; the dock has {list(self.all_columns)}")

    def mark_ready(
        self, indices: np.ndarray, columns: Sequence[str], meta: Mapping[str, np.ndarray] | None = None
    ) -> None:
        """A warehouse reports that ``columns`` of ``indices`` were written (metadata, never data)."""
        self._check_columns(columns)
        for column in columns:
            self.ready[column][indices] = True
        if meta:
            self.meta.update(indices, meta)
        self.notifications += 1

    def validate(self, batch_size: int, columns: Sequence[str], whole_groups: bool) -> None:
        """Reject requests that no future put can satisfy (instead of letting them hang)."""
        self._check_columns(columns)
        unregistered = [c for c in columns if c not in self.columns]
        if unregistered:
            raise DockInvalid(
                f"consumer {self.consumer!r} registered columns {list(self.columns)}, not {unregistered}"
            )
        if batch_size <= 0:
            raise DockInvalid(f"consumer {self.consumer!r}: batch_size must be positive, not {batch_size}")
        remaining = self.capacity - int(self.consumed.sum())
        if whole_groups:
            if batch_size % self.group_size:
                raise DockInvalid(
                    f"consumer {self.consumer!r}: whole_groups needs batch_size ({batch_size}) to be a "
                    f"multiple of group_size ({self.group_size})"
                )
            untouched = self.consumed.reshape(-1, self.group_size).any(axis=1) == 0
            remaining = int(untouched.sum()) * self.group_size
        if batch_size > remaining:
            raise DockInvalid(
                f"consumer {self.consumer!r} asked for {batch_size} samples but only {remaining} "
                f"{'samples in untouched groups ' if whole_groups else ''}of capacity {self.capacity} "
                "are not yet consumed: they can never arrive before a reset"
            )

    def _available(self, columns: Sequence[str], whole_groups: bool) -> np.ndarray:
        mask = ~self.consumed
        for column in columns:
            mask &= self.ready[column]
        if whole_groups:
            complete = mask.reshape(-1, self.group_size).all(axis=1)
            mask = np.repeat(complete, self.group_size)
        return mask

    def take(self, batch_size: int, columns: Sequence[str], whole_groups: bool = False) -> np.ndarray | None:
        """The ``batch_size`` lowest ready-and-unconsumed indices, now marked consumed; None if too few."""
        available = np.flatnonzero(self._available(columns, whole_groups))
        if len(available) < batch_size:
            return None
        chosen = available[:batch_size]
        self.consumed[chosen] = True
        self.gets += 1
        self.samples_out += batch_size
        return chosen

    def readiness(self, batch_size: int, columns: Sequence[str], whole_groups: bool) -> Readiness:
        unconsumed = ~self.consumed
        return Readiness(
            consumer=self.consumer,
            columns=tuple(columns),
            batch_size=batch_size,
            whole_groups=whole_groups,
            ready=int(self._available(columns, whole_groups).sum()),
            missing={c: int((unconsumed & ~self.ready[c]).sum()) for c in columns},
            consumed=int(self.consumed.sum()),
        )

    def reset(self, keep: np.ndarray) -> None:
        """New iteration: nothing consumed; only the kept samples stay ready (and grow older)."""
        kept = np.zeros(self.capacity, dtype=bool)
        kept[keep] = True
        for bitmap in self.ready.values():
            bitmap &= kept
        self.consumed[:] = False
        self.meta.reset(keep)

    def stats(self) -> dict[str, Any]:
        return {
            "consumed": int(self.consumed.sum()),
            "ready": {c: int(b.sum()) for c, b in self.ready.items()},
            "gets": self.gets,
            "samples_out": self.samples_out,
            "notifications": self.notifications,
        }
