"""The asynchronous scheduler (disaggregated placement): generation runs ahead of the update, within a
staleness bound.

Generator workers hold their own copy of the policy. Generation of iteration ``j`` may start once the
weights of update ``j - 1 - max_staleness`` were published to them (the same rule the KFP pipeline turns
into DAG edges), so while the actor trains on iteration ``i`` the generators already produce iterations
``i + 1 .. i + max_staleness`` into their own dock windows, with the weights they hold. Every sample
carries the policy version that generated it; the update checks and reports its age
(``dockflow.workers.staleness``). With ``max_staleness: 0`` each generation waits for the previous
update's weights, which reproduces the synchronous run exactly.

Order on the generators comes from Ray: calls from this driver to one actor run in the order they were
sent, so ``load_weights`` of version ``v`` runs before every generation sent after it.

    scheduler = AsyncScheduler(cfg, workers, dock, sampler, devices, end=cfg.train.iterations)
    for i in range(start, end):
        metrics = scheduler.run_iteration(i)
    scheduler.close()
"""

from __future__ import annotations

import time
from typing import Any

from dockflow.config import Config
from dockflow.dock import TransferDock
from dockflow.flow import stages
from dockflow.flow.idle import IdleTracker
from dockflow.flow.sampler import PromptSampler
from dockflow.flow.sync import iteration_throughput, merge_results, pop_generated, rollout_summary
from dockflow.flow.waiting import wait_stages
from dockflow.workers import Workers


class AsyncScheduler:
    """Keeps up to ``1 + max_staleness`` generations launched ahead and trains on them in order."""

    def __init__(
        self, cfg: Config, workers: Workers, dock: TransferDock, sampler: PromptSampler, devices: float, end: int
    ) -> None:
        if not workers.generators:
            raise ValueError("the asynchronous scheduler needs generator workers (placement.mode: disaggregated)")
        self.cfg, self.workers, self.dock, self.sampler = cfg, workers, dock, sampler
        self.devices = devices
        self.end = end  # iterations run to this one (exclusive); no generation is launched past it
        self.generations: dict[int, stages.Refs] = {}  # launched, not yet trained on
        self.reshard: stages.Refs = {}  # weights on their way to the generators, waited with the next iteration
        self.idle = IdleTracker.for_placement(cfg)
        self.last_end: float | None = None

    def _launch_generation(self, j: int) -> None:
        self.dock.reset(window=self.cfg.dock_window(j))  # free: its previous iteration was trained on
        self.generations[j] = stages.generate(
            self.workers, j, self.sampler.indices(j), group_size=self.cfg.rollout.group_size
        )

    def _start(self, i: int) -> None:
        """Publish the actor's weights (fresh or restored) to the generators, then launch the first
        ``1 + max_staleness`` generations."""
        self.reshard = stages.reshard(self.workers, i - 1)
        for j in range(i, min(i + 1 + self.cfg.train.max_staleness, self.end)):
            self._launch_generation(j)
        self.last_end = time.perf_counter()

    def run_iteration(self, i: int) -> dict[str, float]:
        """Train on iteration ``i``'s samples (generated ahead), publish the new weights, launch generation
        ``i + 1 + max_staleness``. Returns the iteration's metrics."""
        if self.last_end is None:
            self._start(i)
        refs: dict[str, Any] = {**self.generations.pop(i), **self.reshard}
        refs.update(stages.score(self.workers, i))
        refs.update(stages.infer(self.workers, i))
        refs.update(stages.update(self.workers, i))
        results = wait_stages(refs, self.cfg.train.stage_timeout_s, i)
        generated = pop_generated(results)
        self.reshard = stages.reshard(self.workers, i)
        if i + 1 + self.cfg.train.max_staleness < self.end:
            self._launch_generation(i + 1 + self.cfg.train.max_staleness)
        now = time.perf_counter()
        seconds, self.last_end = now - self.last_end, now
        metrics = merge_results(results)
        metrics.update(rollout_summary([generated], self.cfg.global_batch))
        metrics["timing/iteration_s"] = seconds
        metrics["perf/throughput_tps"] = iteration_throughput(metrics, self.devices, seconds)
        metrics.update(self.idle.add(metrics, seconds))
        return metrics

    def close(self) -> None:
        """Wait for the last weights to reach the generators (bounded by ``train.stage_timeout_s``)."""
        if self.reshard:
            wait_stages(self.reshard, self.cfg.train.stage_timeout_s, self.end - 1)
            self.reshard = {}
