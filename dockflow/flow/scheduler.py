"""Pick the scheduler for a run's placement: synchronous when colocated, asynchronous when disaggregated.

Both expose ``run_iteration(i) -> metrics`` and ``close()``, so the CLI loop does not know which one it drives.
"""

from __future__ import annotations

from typing import Protocol

from dockflow.config import Config
from dockflow.dock import TransferDock
from dockflow.flow.asynchronous import AsyncScheduler
from dockflow.flow.idle import IdleTracker
from dockflow.flow.sampler import PromptSampler
from dockflow.flow.sync import run_iteration
from dockflow.workers import Workers


class Scheduler(Protocol):
    def run_iteration(self, i: int) -> dict[str, float]: ...

    def close(self) -> None: ...


class SyncScheduler:
    """On-policy iterations one after the other (``dockflow.flow.sync``), plus idle fractions."""

    def __init__(self, cfg: Config, workers: Workers, dock: TransferDock, sampler: PromptSampler, devices: float) -> None:
        self.cfg, self.workers, self.dock, self.sampler, self.devices = cfg, workers, dock, sampler, devices
        self.idle = IdleTracker.for_placement(cfg)

    def run_iteration(self, i: int) -> dict[str, float]:
        metrics = run_iteration(self.cfg, self.workers, self.dock, self.sampler, i, self.devices)
        metrics.update(self.idle.add(metrics, metrics["timing/iteration_s"]))
        return metrics

    def close(self) -> None:
        """Nothing in flight between iterations."""


def make_scheduler(
    cfg: Config, workers: Workers, dock: TransferDock, sampler: PromptSampler, devices: float, end: int
) -> Scheduler:
    if cfg.placement.mode == "disaggregated":
        return AsyncScheduler(cfg, workers, dock, sampler, devices, end)
    return SyncScheduler(cfg, workers, dock, sampler, devices)
