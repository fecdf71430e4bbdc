"""The CLI driver of a training run: SFT warm start, then RL iterations over the transfer dock.

    summary = train(load_config("configs/grpo_arith.yaml"), resume=False)

It starts (or joins) Ray, creates the dock and the workers, runs ``dockflow.flow.sync`` iterations,
evaluates held-out accuracy, logs to MLflow, checkpoints, and writes ``summary.json`` in the run
directory. The driver only ever handles prompt indices and scalar metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dockflow.config import Config, ConfigError
from dockflow.flow import record
from dockflow.flow.sampler import PromptSampler, iteration_sampler
from dockflow.flow.scheduler import make_scheduler
from dockflow.flow.waiting import StageError
from dockflow.models.initial import initial_model
from dockflow.storage import open_store
from dockflow.tracking import Tracker, run_tags
from dockflow.workers import Workers, create_workers, kill_workers
from dockflow.workers.cluster import connect, disconnect, run_namespace
from dockflow.workers.columns import create_run_dock

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, dict[str, float]], None]


def run_dir_of(cfg: Config) -> Path:
    return Path(cfg.run.output_dir) / cfg.run.name


def _evaluate(cfg: Config, workers: Workers, step: int, state: dict[str, Any]) -> dict[str, float]:
    scores = record.evaluate(cfg, workers, step)
    record.record_eval(state, step, scores)
    return scores


def train(cfg: Config, resume: bool = False, on_iteration: ProgressFn | None = None) -> dict[str, Any]:
    """Run SFT (cached) then ``cfg.train.iterations`` RL iterations; returns the summary."""
    if cfg.train.max_staleness and cfg.placement.mode == "colocated":
        raise ConfigError(
            f"train.max_staleness={cfg.train.max_staleness} with placement.mode=colocated: one actor worker cannot "
            "generate ahead of its own update; set placement.mode: disaggregated (generator workers), or 0"
        )
    t_start = time.perf_counter()
    run_dir = run_dir_of(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))

    model_dir, init_metrics = initial_model(cfg, run_dir)
    store = open_store(cfg.checkpoint, run_dir)
    start_step = store.latest() if resume else None
    if resume and start_step is None:
        log.warning("--resume: no committed checkpoint under %s; starting from iteration 0", store.location())
    driver_state = record.initial_state()
    if start_step is not None:
        driver_state = store.read_part(start_step, "driver", weights_only=False)

    namespace = run_namespace(cfg)
    tracker = Tracker.start(
        cfg.tracking, run_dir, cfg.run.name, params=cfg.flat(), tags=run_tags(cfg), run_id=driver_state.get("mlflow_run_id")
    )
    driver_state["mlflow_run_id"] = tracker.run_id
    status = "FAILED"
    owns_ray = connect(cfg.ray, namespace)
    dock = workers = None
    try:
        tracker.log_metrics(init_metrics, step=0)
        dock = create_run_dock(cfg, namespace)
        workers = _start_workers(cfg, model_dir, dock, store, start_step)
        if start_step is None:
            tracker.log_metrics(_evaluate(cfg, workers, 0, driver_state), step=0)

        sampler = iteration_sampler(cfg)
        while True:
            try:
                _iterate(cfg, workers, dock, sampler, store, driver_state, tracker, on_iteration)
                break
            except StageError as exc:
                restarts = driver_state["restarts"]
                if not (exc.worker_died and cfg.fault_tolerance.restart and restarts < cfg.fault_tolerance.max_restarts):
                    raise
                kill_workers(workers)
                workers = None
                driver_state = _recover_state(store, driver_state, exc)
                driver_state["restarts"] = restarts + 1
                workers = _start_workers(cfg, model_dir, dock, store, driver_state.pop("checkpoint"))
                tracker.log_metrics({"fault/restarts": restarts + 1}, step=driver_state["iteration"])

        summary = record.finish(
            cfg, run_dir, workers, store, tracker, driver_state, init_metrics, model_dir, time.perf_counter() - t_start
        )
        status = "FINISHED"
        return summary
    finally:
        if workers is not None:
            kill_workers(workers)
        if dock is not None:
            dock.shutdown()
        if owns_ray:
            disconnect()
        tracker.end(status)


def _start_workers(cfg: Config, model_dir: str, dock, store, step: int | None) -> Workers:
    """Create the workers; from checkpoint ``step`` when given, else from the initial model."""
    workers = create_workers(cfg, model_dir, dock, cfg.run.name)
    if step is not None:
        record.restore_workers(store, workers, step, cfg)
    return workers


def _iterate(cfg: Config, workers: Workers, dock, sampler: PromptSampler, store, state: dict[str, Any],
             tracker: Tracker, on_iteration: ProgressFn | None) -> None:
    """Iterations from ``state["iteration"]`` to the end: run, evaluate, log, checkpoint."""
    scheduler = make_scheduler(cfg, workers, dock, sampler, record.devices(cfg), cfg.train.iterations)
    for it in range(state["iteration"], cfg.train.iterations):
        step = it + 1
        metrics = scheduler.run_iteration(it)
        if record.eval_due(cfg, step):
            metrics.update(_evaluate(cfg, workers, step, state))
        record.record_iteration(cfg, state, step, metrics)
        tracker.log_metrics_or_defer(metrics, step=step)  # an MLflow outage must not stop training
        if on_iteration:
            on_iteration(step, metrics)
        if record.ckpt_due(cfg, step):
            record.save_checkpoint(store, workers, step, state, cfg)
    scheduler.close()


def _recover_state(store, state: dict[str, Any], exc: StageError) -> dict[str, Any]:
    """After a worker died: the driver state of the latest committed checkpoint, or of the start (keeping the
    iteration-0 evaluation). Iterations after it are run again, so none is counted twice."""
    step = store.latest()
    if step is not None:
        recovered = store.read_part(step, "driver", weights_only=False)
    else:
        recovered = record.initial_state()
        recovered["evals"] = [e for e in state["evals"] if e[0] == 0]
        recovered["eval_scores"] = [e for e in state.get("eval_scores", []) if e[0] == 0]
    recovered["mlflow_run_id"] = state["mlflow_run_id"]
    recovered["checkpoint"] = step
    log.warning(
        "%s; restarting the workers from %s (fault_tolerance.restart)",
        exc,
        f"checkpoint {step}" if step is not None else "the initial model",
    )
    return recovered
