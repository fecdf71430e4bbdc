"""A controller's bookkeeping for one consumer (worker state): which (sample, column) pairs are ready, which
samples the consumer already took, and their metadata. Pure Python + numpy; the dock node part wrapping it is
in ``node_parts.py`` and the centralized buffer reuses it as is."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dockflow.dock.errors import DockInvalid
from dockflow.dock.meta import MetaTable
from dockflow.dock.partition import balanced_partitions
from dockflow.dock.window import Window, dropped_mask, window_mask


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
        owners: np.ndarray | None = None,
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
        self.resets = np.zeros(capacity, dtype=np.int64)  # per sample: a get waiting across its reset is cancelled
        self.meta = MetaTable(capacity, group_size)
        # Warehouse (shard) of each sample, for gets that prefer their own node's warehouses; None: one shard.
        self.owners = owners
        self._preferred: dict[tuple[int, ...], np.ndarray] = {}
        # DP shares split off for a rank but not yet taken by it: (window, rank) -> FIFO of index arrays.
        self._shares: dict[tuple[Window | None, int], deque[np.ndarray]] = {}
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

    def validate(
        self,
        batch_size: int,
        columns: Sequence[str],
        whole_groups: bool,
        window: Window | None = None,
        dp_share: tuple[int, int] | None = None,
    ) -> None:
        """Reject requests that no future put can satisfy (instead of letting them hang): columns this consumer
        did not register, more samples than are left unconsumed. The form checks of the client
        (``validation.check_get``) are repeated for requests that reach the actor without it."""
        self._check_columns(columns)
        unregistered = [c for c in columns if c not in self.columns]
        if unregistered:
            raise DockInvalid(
                f"consumer {self.consumer!r} registered columns {list(self.columns)}, not {unregistered}"
            )
        if dp_share is not None:
            rank, ranks = dp_share
            if not 0 <= rank < ranks:
                raise DockInvalid(f"consumer {self.consumer!r}: dp_share rank {rank} is not in [0, {ranks})")
            if self._shares.get((window, rank)):
                return  # this rank's share is already split off (and consumed)
            batch_size = self.samples_needed(batch_size, window, dp_share)
        if batch_size <= 0:
            raise DockInvalid(f"consumer {self.consumer!r}: batch_size must be positive, not {batch_size}")
        open_ = window_mask(self.capacity, window) & ~self.consumed
        remaining = int(open_.sum())
        if whole_groups:
            if batch_size % self.group_size:
                raise DockInvalid(
                    f"consumer {self.consumer!r}: whole_groups needs batch_size ({batch_size}) to be a "
                    f"multiple of group_size ({self.group_size})"
                )
            untouched = open_.reshape(-1, self.group_size).all(axis=1)
            remaining = int(untouched.sum()) * self.group_size
        if batch_size > remaining:
            raise DockInvalid(
                f"consumer {self.consumer!r} asked for {batch_size} samples but only {remaining} "
                f"{'samples in untouched groups ' if whole_groups else ''}of "
                f"{f'window {list(window)}' if window else f'capacity {self.capacity}'} "
                "are not yet consumed: they can never arrive before a reset"
            )

    def samples_needed(
        self, batch_size: int, window: Window | None = None, dp_share: tuple[int, int] | None = None
    ) -> int:
        """Ready samples a take must find: a DP rank whose share is not split off yet needs the whole mini-batch."""
        if dp_share is None or self._shares.get((window, dp_share[0])):
            return batch_size
        return batch_size * dp_share[1]

    def _available(self, columns: Sequence[str], whole_groups: bool, window: Window | None = None) -> np.ndarray:
        mask = ~self.consumed & window_mask(self.capacity, window)
        for column in columns:
            mask &= self.ready[column]
        if whole_groups:
            complete = mask.reshape(-1, self.group_size).all(axis=1)
            mask = np.repeat(complete, self.group_size)
        return mask

    def take(
        self,
        batch_size: int,
        columns: Sequence[str],
        whole_groups: bool = False,
        window: Window | None = None,
        prefer: Sequence[int] | None = None,
        dp_share: tuple[int, int] | None = None,
    ) -> np.ndarray | None:
        """``batch_size`` ready-and-unconsumed indices (in ``window``), now marked consumed; None if too few.

        The lowest indices win; with ``prefer`` (shard ids, e.g. the warehouses on the caller's node) ready
        samples of those shards come first and the rest fill up, so a consumer reads locally when it can
        and still takes from elsewhere rather than wait. Returned ascending.

        ``dp_share=(rank, ranks)``: the caller is one of ``ranks`` data-parallel ranks, each asking for its
        ``batch_size`` share of a mini-batch of ``ranks * batch_size``. The first rank to ask takes the whole
        mini-batch and splits it by response length (metadata) into equal-count shares with near-equal token
        totals; every rank's k-th get returns its share of the k-th mini-batch."""
        if dp_share is None:
            return self._take(batch_size, columns, whole_groups, window, prefer)
        rank, ranks = dp_share
        pending = self._shares.get((window, rank))
        if pending:
            share = pending.popleft()
            if len(share) != batch_size:
                raise DockInvalid(
                    f"consumer {self.consumer!r}: DP rank {rank} asked for {batch_size} samples but its share of "
                    f"the mini-batch holds {len(share)}: all ranks must ask for equal shares in the same order"
                )
            return share
        chosen = self._take(batch_size * ranks, columns, whole_groups, window, prefer)
        if chosen is None:
            return None
        shares = self._split(chosen, ranks, whole_groups)
        for r, share in enumerate(shares):
            if r != rank:
                self._shares.setdefault((window, r), deque()).append(share)
        return shares[rank]

    def _split(self, chosen: np.ndarray, ranks: int, whole_groups: bool) -> list[np.ndarray]:
        """Equal-count shares of ``chosen`` with near-equal response tokens (whole groups stay together)."""
        lengths = np.maximum(self.meta.values["response_length"][chosen], 0)  # -1: not reported
        unit = self.group_size if whole_groups else 1
        weights = lengths.reshape(-1, unit).sum(axis=1).tolist()
        units = chosen.reshape(-1, unit)
        return [np.sort(units[part].reshape(-1)) for part in balanced_partitions(weights, ranks)]

    def _take(
        self,
        batch_size: int,
        columns: Sequence[str],
        whole_groups: bool,
        window: Window | None,
        prefer: Sequence[int] | None,
    ) -> np.ndarray | None:
        mask = self._available(columns, whole_groups, window)
        preferred = self._preferred_mask(prefer)
        if preferred is None:
            available = np.flatnonzero(mask)
        else:
            available = np.concatenate([np.flatnonzero(mask & preferred), np.flatnonzero(mask & ~preferred)])
        if len(available) < batch_size:
            return None
        # Whole groups stay whole: shards hold whole groups, so both parts are runs of complete groups.
        chosen = np.sort(available[:batch_size])
        self.consumed[chosen] = True
        self.gets += 1
        self.samples_out += batch_size
        return chosen

    def _preferred_mask(self, prefer: Sequence[int] | None) -> np.ndarray | None:
        if prefer is None or self.owners is None:
            return None
        key = tuple(sorted(prefer))
        if key not in self._preferred:
            self._preferred[key] = np.isin(self.owners, key)
        return self._preferred[key]

    def available(self, columns: Sequence[str], whole_groups: bool, window: Window | None = None) -> int:
        """How many samples a take of ``columns`` could choose from now (ready, unconsumed, in ``window``)."""
        return int(self._available(columns, whole_groups, window).sum())

    def readiness(
        self, batch_size: int, columns: Sequence[str], whole_groups: bool, window: Window | None = None
    ) -> Readiness:
        unconsumed = ~self.consumed & window_mask(self.capacity, window)
        return Readiness(
            consumer=self.consumer,
            columns=tuple(columns),
            batch_size=batch_size,
            whole_groups=whole_groups,
            ready=int(self._available(columns, whole_groups, window).sum()),
            missing={c: int((unconsumed & ~self.ready[c]).sum()) for c in columns},
            consumed=int((self.consumed & window_mask(self.capacity, window)).sum()),
        )

    def reset(self, keep: np.ndarray, window: Window | None = None) -> None:
        """New iteration in ``window`` (default: the whole dock): nothing there consumed; only the kept samples
        stay ready (and grow older). Samples outside the window are untouched."""
        dropped = dropped_mask(self.capacity, keep, window)
        for bitmap in self.ready.values():
            bitmap[dropped] = False
        scope = window_mask(self.capacity, window)
        self.consumed[scope] = False
        self.resets[scope] += 1
        for key in [k for k in self._shares if k[0] is None or window is None or k[0] == window]:
            del self._shares[key]
        self.meta.reset(keep, window)

    def reset_count(self, window: Window | None = None) -> int:
        """Resets that touched ``window`` so far: a waiting get compares it to the count it started with."""
        lo, hi = window if window is not None else (0, self.capacity)
        return int(self.resets[lo:hi].sum())

    def stats(self) -> dict[str, Any]:
        return {
            "consumed": int(self.consumed.sum()),
            "ready": {c: int(b.sum()) for c, b in self.ready.items()},
            "gets": self.gets,
            "samples_out": self.samples_out,
            "notifications": self.notifications,
        }
