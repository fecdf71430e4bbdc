"""Idle fractions of the worker groups: how much of the run's wall time each group spent not working.

Busy time comes from the stages' own timings (``timing/*_s`` metrics); wall time from the scheduler. The
fractions are cumulative from the scheduler's start, so they settle to the run's steady state.
Colocated, the actor worker does all three policy stages; disaggregated, the trainer (the actor worker)
infers and updates while the generator workers generate.
"""

from __future__ import annotations

from dataclasses import dataclass

from dockflow.config import Config

_GENERATE = "timing/generate_busy_s"  # summed over generator workers (pop_generated)
_TRAIN = ("timing/old_log_prob_s", "timing/update_s")
_TRAIN_WAITS = ("timing/old_log_prob_wait_s", "timing/update_wait_s")  # inside those, waiting on the dock


@dataclass(frozen=True)
class Group:
    workers: int  # how many workers share the busy time
    busy_keys: tuple[str, ...]  # stage seconds
    wait_keys: tuple[str, ...] = ()  # seconds within them spent waiting for samples (not busy)


class IdleTracker:
    """Accumulates busy seconds per group and reports ``flow/idle_<group>`` = 1 - busy / (workers x wall)."""

    def __init__(self, groups: dict[str, Group]) -> None:
        self.groups = groups
        self.busy = dict.fromkeys(groups, 0.0)
        self.wall = 0.0

    @classmethod
    def for_placement(cls, cfg: Config) -> IdleTracker:
        if cfg.placement.mode == "colocated":
            return cls({"actor": Group(1, (_GENERATE, *_TRAIN), _TRAIN_WAITS)})
        return cls({"trainer": Group(1, _TRAIN, _TRAIN_WAITS), "generator": Group(cfg.placement.generators, (_GENERATE,))})

    def add(self, metrics: dict[str, float], seconds: float) -> dict[str, float]:
        """Count one iteration (its metrics and wall seconds); return the cumulative idle fractions."""
        self.wall += seconds
        for name, group in self.groups.items():
            self.busy[name] += sum(metrics.get(k, 0.0) for k in group.busy_keys) - sum(
                metrics.get(k, 0.0) for k in group.wait_keys
            )
        if self.wall <= 0:
            return {}
        return {
            f"flow/idle_{name}": max(0.0, 1.0 - self.busy[name] / (group.workers * self.wall))
            for name, group in self.groups.items()
        }
