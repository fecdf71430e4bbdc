"""Per-rank memory ledger: device bytes by category at each named step, peaks per phase, MLflow metrics.

Categories are counted from the tensors the ledger tracks (weak references, so tracking never keeps a
tensor alive): the sum of their untyped storages' nbytes on the ledger's device, each storage counted once
(by data_ptr) and in the first category that holds it, so views and aliases are not double counted. A
storage resized to zero (swapped to host) counts zero. On CUDA / NPU every snapshot also reads the
allocator (``memory_allocated`` and the peak since the phase began), which sees what the tracked tensors
cannot: activations, the KV cache, fragmentation.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from dockflow.reshard.accelerator import accelerator_of

CATEGORIES = ("update_weights", "grads", "optimizer_state", "temp_buffer", "generation_weights")
UPDATE_STATE = ("update_weights", "grads", "optimizer_state")


@dataclass(frozen=True)
class Snapshot:
    """Device bytes at one named step of one phase."""

    step: str
    phase: str
    by_category: dict[str, int]
    total: int
    allocated: int | None = None  # allocator bytes, CUDA / NPU only
    allocator_peak: int | None = None  # allocator peak since the phase began, CUDA / NPU only


def storage_bytes(tensors: Iterable[torch.Tensor], device: torch.device | None = None) -> int:
    """Bytes of the distinct storages behind ``tensors`` (on ``device`` when given)."""
    seen: set[tuple[str, int]] = set()
    return _count(tensors, device, seen)


def _count(tensors: Iterable[torch.Tensor], device: torch.device | None, seen: set[tuple[str, int]]) -> int:
    total = 0
    for t in tensors:
        if device is not None and not _same_device(t.device, device):
            continue
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        key = (str(t.device), storage.data_ptr())
        if nbytes == 0 or key in seen:
            continue
        seen.add(key)
        total += nbytes
    return total


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


class MemoryLedger:
    """Bytes by category on one rank's device, recorded at named steps and grouped into phases."""

    def __init__(self, device: torch.device | str = "cpu", rank: int = 0) -> None:
        self.device = torch.device(device)
        self.rank = rank
        self._tracked: dict[str, list[weakref.ref[torch.Tensor]]] = {c: [] for c in CATEGORIES}
        self._snapshots: list[Snapshot] = []
        self._phase: str | None = None

    def track(self, category: str, tensors: Iterable[torch.Tensor] | Mapping[str, torch.Tensor]) -> None:
        """Make ``tensors`` the tracked set of ``category`` (replacing what it tracked)."""
        self._check(category)
        self._tracked[category] = []
        self.add(category, tensors)

    def add(self, category: str, tensors: Iterable[torch.Tensor] | Mapping[str, torch.Tensor]) -> None:
        """Track ``tensors`` in ``category`` as well."""
        self._check(category)
        values = tensors.values() if isinstance(tensors, Mapping) else tensors
        self._tracked[category].extend(weakref.ref(t) for t in values)

    def clear(self, category: str) -> None:
        self.track(category, [])

    def _check(self, category: str) -> None:
        if category not in CATEGORIES:
            raise ValueError(f"unknown ledger category {category!r}; expected one of {CATEGORIES}")

    def tensors(self, category: str) -> list[torch.Tensor]:
        """The still-alive tensors tracked in ``category``."""
        self._check(category)
        return [t for ref in self._tracked[category] if (t := ref()) is not None]

    def bytes_by_category(self) -> dict[str, int]:
        """Device bytes per category now, each storage counted once, in the first category holding it."""
        seen: set[tuple[str, int]] = set()
        return {c: _count(self.tensors(c), self.device, seen) for c in CATEGORIES}

    def record(self, step: str, phase: str) -> Snapshot:
        """Snapshot the categories (and the allocator on CUDA / NPU) as step ``step`` of ``phase``."""
        allocator = accelerator_of(self.device)
        if phase != self._phase:
            self._phase = phase
            if allocator is not None:
                allocator.reset_peak_memory_stats(self.device)
        by_category = self.bytes_by_category()
        allocated = peak = None
        if allocator is not None:
            allocated = int(allocator.memory_allocated(self.device))
            peak = int(allocator.max_memory_allocated(self.device))
        snap = Snapshot(step, phase, by_category, sum(by_category.values()), allocated, peak)
        self._snapshots.append(snap)
        return snap

    def snapshots(self, phase: str | None = None) -> list[Snapshot]:
        return [s for s in self._snapshots if phase is None or s.phase == phase]

    def phases(self) -> list[str]:
        """Phases in the order first recorded."""
        return list(dict.fromkeys(s.phase for s in self._snapshots))

    def peak(self, phase: str) -> int:
        """Largest tracked total recorded in ``phase``; KeyError when nothing was recorded there."""
        snaps = self.snapshots(phase)
        if not snaps:
            raise KeyError(f"ledger of rank {self.rank} has no snapshot in phase {phase!r}; phases: {self.phases()}")
        return max(s.total for s in snaps)

    def category_peak(self, phase: str, category: str) -> int:
        self._check(category)
        snaps = self.snapshots(phase)
        if not snaps:
            raise KeyError(f"ledger of rank {self.rank} has no snapshot in phase {phase!r}; phases: {self.phases()}")
        return max(s.by_category[category] for s in snaps)

    def to_metrics(self) -> dict[str, float]:
        """Flat floats for MLflow: ``memory/<phase>/<category>_bytes`` (peak over the phase's steps),
        ``memory/<phase>/peak_bytes``, and on CUDA / NPU ``memory/<phase>/allocator_peak_bytes``."""
        metrics: dict[str, float] = {}
        for phase in self.phases():
            snaps = self.snapshots(phase)
            for category in CATEGORIES:
                metrics[f"memory/{phase}/{category}_bytes"] = float(max(s.by_category[category] for s in snaps))
            metrics[f"memory/{phase}/peak_bytes"] = float(max(s.total for s in snaps))
            peaks = [s.allocator_peak for s in snaps if s.allocator_peak is not None]
            if peaks:
                metrics[f"memory/{phase}/allocator_peak_bytes"] = float(max(peaks))
        return metrics
