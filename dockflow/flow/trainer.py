"""The CLI driver of a training run: SFT warm start, then RL iterations over the transfer dock.

    summary = train(load_config("configs/grpo_arith.yaml"), resume=False)

It starts (or joins) Ray, creates the dock and the workers, runs ``dockflow.flow.sync`` iterations,
evaluates held-out accuracy, logs to MLflow, checkpoints, and writes ``summary.json`` in the run
directory. The driver only ever handles prompt indices and scalar metrics.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dockflow.config import Config
from dockflow.dock import DockSpec, create_dock
from dockflow.flow import stages
from dockflow.flow.sampler import PromptSampler
from dockflow.flow.sync import run_iteration
from dockflow.flow.waiting import wait_stages
from dockflow.models.initial import initial_model
from dockflow.storage import open_store
from dockflow.tracking import Tracker, plot_curves
from dockflow.workers import Workers, create_workers, kill_workers
from dockflow.workers.cluster import connect, disconnect
from dockflow.workers.columns import COLUMNS, consumers

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, dict[str, float]], None]


def run_dir_of(cfg: Config) -> Path:
    return Path(cfg.run.output_dir) / cfg.run.name


def _devices(cfg: Config) -> float:
    """ND of Eq. (5): the cores reserved by model workers."""
    return cfg.ray.actor_cpus + (cfg.ray.reference_cpus if cfg.algorithm.kl_coef > 0 else 0.0)


def _eval_due(cfg: Config, iteration: int) -> bool:
    every = cfg.eval.every
    return iteration == cfg.train.iterations or (every > 0 and iteration % every == 0)


def _ckpt_due(cfg: Config, iteration: int) -> bool:
    every = cfg.checkpoint.every
    return iteration == cfg.train.iterations or (every > 0 and iteration % every == 0)


def _evaluate(cfg: Config, workers: Workers, iteration: int) -> float:
    res = wait_stages(stages.evaluate(workers, cfg.eval.num_prompts), cfg.train.stage_timeout_s, iteration)
    return res["evaluate"]["eval/test_accuracy"]


def _save(store, workers: Workers, step: int, driver_state: dict[str, Any], cfg: Config) -> None:
    wait_stages({"checkpoint": workers.actor.save.remote(store, step)}, cfg.train.stage_timeout_s, step)
    store.write_part(step, "driver", driver_state)
    store.commit(step, {"iteration": step, "accuracy": driver_state["evals"][-1][1] if driver_state["evals"] else None})


def train(cfg: Config, resume: bool = False, on_iteration: ProgressFn | None = None) -> dict[str, Any]:
    """Run SFT (cached) then ``cfg.train.iterations`` RL iterations; returns the summary."""
    t_start = time.perf_counter()
    run_dir = run_dir_of(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))

    model_dir, init_metrics = initial_model(cfg, run_dir)
    store = open_store(cfg.checkpoint, run_dir)
    start_step = store.latest() if resume else None
    if resume and start_step is None:
        log.warning("--resume: no committed checkpoint under %s; starting from iteration 0", store.location())
    driver_state: dict[str, Any] = {"iteration": 0, "history": [], "evals": [], "data_position": 0}
    if start_step is not None:
        driver_state = store.read_part(start_step, "driver", weights_only=False)

    namespace = cfg.ray.namespace or f"dockflow-{cfg.run.name}"
    tags = {"algorithm": cfg.algorithm.name, "model": cfg.model.path or "tiny-qwen2", "dock_backend": cfg.dock.backend}
    tracker = Tracker.start(
        cfg.tracking, run_dir, cfg.run.name, params=cfg.flat(), tags=tags, run_id=driver_state.get("mlflow_run_id")
    )
    driver_state["mlflow_run_id"] = tracker.run_id
    status = "FAILED"
    connect(cfg.ray, namespace)
    dock = workers = None
    try:
        tracker.log_metrics(init_metrics, step=0)
        dock = create_dock(
            DockSpec(
                columns=COLUMNS,
                capacity=cfg.global_batch,
                group_size=cfg.rollout.group_size,
                backend=cfg.dock.backend,
                num_warehouses=cfg.dock.num_warehouses,
                name=f"{cfg.run.name}-dock",
                namespace=namespace,
                get_timeout_s=cfg.dock.get_timeout_s,
            )
        )
        for consumer, cols in consumers(cfg).items():
            dock.register_consumer(consumer, cols)
        workers = create_workers(cfg, model_dir, dock, cfg.run.name)
        if start_step is not None:
            wait_stages({"restore": workers.actor.load.remote(store, start_step)}, cfg.train.stage_timeout_s, start_step)
        else:
            acc = _evaluate(cfg, workers, 0)
            driver_state["evals"].append((0, acc))
            tracker.log_metrics({"eval/test_accuracy": acc}, step=0)

        sampler = PromptSampler(len_train(cfg), cfg.rollout.prompts_per_iter, cfg.run.seed)
        for it in range(driver_state["iteration"], cfg.train.iterations):
            step = it + 1
            metrics = run_iteration(cfg, workers, dock, sampler, it, _devices(cfg))
            if _eval_due(cfg, step):
                acc = _evaluate(cfg, workers, step)
                driver_state["evals"].append((step, acc))
                metrics["eval/test_accuracy"] = acc
            driver_state["history"].append(
                {k: metrics[k] for k in ("reward/mean", "perf/throughput_tps", "timing/iteration_s")}
            )
            driver_state["iteration"] = step
            driver_state["data_position"] = sampler.position(step)
            tracker.log_metrics(metrics, step=step)
            if on_iteration:
                on_iteration(step, metrics)
            if _ckpt_due(cfg, step):
                _save(store, workers, step, driver_state, cfg)

        final_dir = run_dir / "final_model"
        wait_stages({"save_final": workers.actor.save_hf.remote(str(final_dir))}, cfg.train.stage_timeout_s, cfg.train.iterations)
        summary = _summary(cfg, driver_state, init_metrics, tracker.run_id, time.perf_counter() - t_start)
        summary["final_model"] = str(final_dir)
        summary["initial_model"] = model_dir
        summary_path = run_dir / "summary.json"
        summary_path.write_text(json.dumps(summary, indent=2))
        _log_artifacts(tracker, run_dir, driver_state)
        status = "FINISHED"
        return summary
    finally:
        if workers is not None:
            kill_workers(workers)
        if dock is not None:
            dock.shutdown()
        disconnect()
        tracker.end(status)


def _log_artifacts(tracker: Tracker, run_dir: Path, state: dict[str, Any]) -> None:
    """summary.json, the config, and a PNG of reward and held-out accuracy against iteration."""
    curves = {
        "reward/mean": [(i + 1, h["reward/mean"]) for i, h in enumerate(state["history"])],
        "eval/test_accuracy": [(i, a) for i, a in state["evals"]],
    }
    plot = plot_curves(curves, run_dir / "curves.png", title=run_dir.name)
    for path in (run_dir / "summary.json", run_dir / "config.yaml", plot):
        tracker.log_artifact(path)


def len_train(cfg: Config) -> int:
    """Number of train prompts (cheap: the arithmetic generator is deterministic and fast)."""
    from dockflow.data import load_task

    return len(load_task(cfg.data, cfg.run.seed).train)


def _summary(cfg: Config, state: dict[str, Any], init: dict[str, float], run_id: str, wall: float) -> dict[str, Any]:
    hist = state["history"]
    tps = [h["perf/throughput_tps"] for h in hist]
    evals = state["evals"]
    return {
        "run_name": cfg.run.name,
        "accuracy_before": evals[0][1] if evals and evals[0][0] == 0 else None,
        "accuracy_after": evals[-1][1] if evals else None,
        "iterations": state["iteration"],
        "throughput_tps": sum(tps) / len(tps) if tps else 0.0,
        "wall_seconds": wall,
        "mlflow_run_id": run_id,
        "evals": [{"iteration": i, "accuracy": a} for i, a in evals],
        "reward_per_iteration": [h["reward/mean"] for h in hist],
        "seconds_per_iteration": sum(h["timing/iteration_s"] for h in hist) / len(hist) if hist else 0.0,
        **{k: v for k, v in init.items()},
    }
