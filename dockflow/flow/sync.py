"""The synchronous (on-policy) scheduler: one iteration = generate -> infer -> update -> reshard.

All stages of an iteration are launched at once; the dock's readiness and Ray's per-actor call order
give the dependencies, so reward and reference scoring stream behind generation with no stage barrier.
"""

from __future__ import annotations

import time

from dockflow.config import Config
from dockflow.dock import TransferDock
from dockflow.flow import stages
from dockflow.flow.sampler import PromptSampler
from dockflow.flow.throughput import throughput_tps
from dockflow.flow.waiting import wait_stages
from dockflow.workers import Workers


def run_iteration(
    cfg: Config, workers: Workers, dock: TransferDock, sampler: PromptSampler, iteration: int, devices: float
) -> dict[str, float]:
    """Run one on-policy iteration; returns its metrics (scalars only)."""
    dock.reset()
    start = time.perf_counter()
    refs = {}
    refs.update(stages.generate(workers, iteration, sampler.indices(iteration)))
    refs.update(stages.infer(workers, iteration))
    refs.update(stages.update(workers, iteration))
    refs.update(stages.reshard(workers, iteration))
    results = wait_stages(refs, cfg.train.stage_timeout_s, iteration)
    seconds = time.perf_counter() - start
    metrics: dict[str, float] = {}
    for part in results.values():
        metrics.update(part)
    metrics["timing/iteration_s"] = seconds
    metrics["perf/throughput_tps"] = throughput_tps(
        cfg.global_batch, metrics["rollout/prompt_length"], metrics["rollout/response_length"], devices, seconds
    )
    return metrics
