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
from dockflow.flow.waiting import StageError, wait_stages
from dockflow.models.initial import initial_model
from dockflow.storage import open_store
from dockflow.tracking import Tracker, plot_curves, run_tags
from dockflow.workers import Workers, create_workers, kill_workers
from dockflow.workers.cluster import connect, disconnect
from dockflow.workers.columns import COLUMNS, consumers, uses_critic, uses_reference

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, dict[str, float]], None]


def run_dir_of(cfg: Config) -> Path:
    return Path(cfg.run.output_dir) / cfg.run.name


def _devices(cfg: Config) -> float:
    """ND of Eq. (5): the cores reserved by model workers."""
    ray = cfg.ray
    return (
        ray.actor_cpus
        + (ray.reference_cpus if uses_reference(cfg) else 0.0)
        + (ray.critic_cpus if uses_critic(cfg) else 0.0)
    )


def _eval_due(cfg: Config, iteration: int) -> bool:
    every = cfg.eval.every
    return iteration == cfg.train.iterations or (every > 0 and iteration % every == 0)


def _ckpt_due(cfg: Config, iteration: int) -> bool:
    every = cfg.checkpoint.every
    return iteration == cfg.train.iterations or (every > 0 and iteration % every == 0)


def _evaluate(cfg: Config, workers: Workers, iteration: int, state: dict[str, Any]) -> dict[str, float]:
    """Held-out scores at ``iteration``, recorded in the driver state; returns them (timing excluded)."""
    res = wait_stages(stages.evaluate(workers, cfg.eval.num_prompts), cfg.train.stage_timeout_s, iteration)
    scores = {k: v for k, v in res["evaluate"].items() if k.startswith("eval/")}
    state["evals"].append((iteration, scores["eval/test_accuracy"]))
    state.setdefault("eval_scores", []).append((iteration, scores))
    return scores


def _stateful(workers: Workers) -> dict[str, Any]:
    """Workers whose state a checkpoint holds (each writes its own part)."""
    return {k: v for k, v in {"actor": workers.actor, "critic": workers.critic}.items() if v is not None}


def _save(store, workers: Workers, step: int, driver_state: dict[str, Any], cfg: Config) -> None:
    refs = {f"checkpoint_{k}": w.save.remote(store, step) for k, w in _stateful(workers).items()}
    wait_stages(refs, cfg.train.stage_timeout_s, step)
    store.write_part(step, "driver", driver_state)
    store.write_part(step, "config", cfg.model_dump())  # what produced it, readable without the run directory
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
    driver_state = _initial_state()
    if start_step is not None:
        driver_state = store.read_part(start_step, "driver", weights_only=False)

    namespace = cfg.ray.namespace or f"dockflow-{cfg.run.name}"
    tracker = Tracker.start(
        cfg.tracking, run_dir, cfg.run.name, params=cfg.flat(), tags=run_tags(cfg), run_id=driver_state.get("mlflow_run_id")
    )
    driver_state["mlflow_run_id"] = tracker.run_id
    status = "FAILED"
    owns_ray = connect(cfg.ray, namespace)
    dock = workers = None
    try:
        tracker.log_metrics(init_metrics, step=0)
        dock = create_dock(
            DockSpec(
                columns=COLUMNS,
                capacity=cfg.global_batch * cfg.rounds,
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
        workers = _start_workers(cfg, model_dir, dock, store, start_step)
        if start_step is None:
            tracker.log_metrics(_evaluate(cfg, workers, 0, driver_state), step=0)

        sampler = PromptSampler(len_train(cfg), cfg.rollout.prompts_per_iter * cfg.rounds, cfg.run.seed)
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

        final_dir = run_dir / "final_model"
        wait_stages({"save_final": workers.actor.save_hf.remote(str(final_dir))}, cfg.train.stage_timeout_s, cfg.train.iterations)
        summary = _summary(cfg, driver_state, init_metrics, tracker.run_id, time.perf_counter() - t_start)
        summary["final_model"] = str(final_dir)
        summary["initial_model"] = model_dir
        summary["checkpoints"] = store.location()
        summary_path = run_dir / "summary.json"
        summary_path.write_text(json.dumps(summary, indent=2))
        tracker.flush_deferred(run_dir / "metrics_unsent.jsonl")
        # Pointers, not copies: the final HF model directory and the checkpoint store (a path or s3:// URI).
        tracker.set_tags({"final_model": str(final_dir.resolve()), "checkpoint_uri": store.location()})
        _log_artifacts(tracker, run_dir, driver_state)
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


def _initial_state() -> dict[str, Any]:
    """The driver's own state: what a checkpoint needs besides the workers' parts."""
    return {"iteration": 0, "history": [], "evals": [], "data_position": 0, "samples": 0, "restarts": 0}


def _start_workers(cfg: Config, model_dir: str, dock, store, step: int | None) -> Workers:
    """Create the workers; from checkpoint ``step`` when given, else from the initial model."""
    workers = create_workers(cfg, model_dir, dock, cfg.run.name)
    if step is not None:
        refs = {f"restore_{k}": w.load.remote(store, step) for k, w in _stateful(workers).items()}
        wait_stages(refs, cfg.train.stage_timeout_s, step)
    return workers


def _iterate(cfg: Config, workers: Workers, dock, sampler: PromptSampler, store, state: dict[str, Any],
             tracker: Tracker, on_iteration: ProgressFn | None) -> None:
    """Iterations from ``state["iteration"]`` to the end: run, evaluate, log, checkpoint."""
    for it in range(state["iteration"], cfg.train.iterations):
        step = it + 1
        metrics = run_iteration(cfg, workers, dock, sampler, it, _devices(cfg))
        if _eval_due(cfg, step):
            metrics.update(_evaluate(cfg, workers, step, state))
        state["history"].append(
            {k: metrics[k] for k in ("reward/mean", "perf/throughput_tps", "timing/iteration_s") if k in metrics}
        )
        state["iteration"] = step
        state["data_position"] = sampler.position(step)
        state["samples"] += cfg.train_batch
        metrics["train/samples"] = float(state["samples"])
        tracker.log_metrics_or_defer(metrics, step=step)  # an MLflow outage must not stop training
        if on_iteration:
            on_iteration(step, metrics)
        if _ckpt_due(cfg, step):
            _save(store, workers, step, state, cfg)


def _recover_state(store, state: dict[str, Any], exc: StageError) -> dict[str, Any]:
    """After a worker died: the driver state of the latest committed checkpoint, or of the start (keeping the
    iteration-0 evaluation). Iterations after it are run again, so none is counted twice."""
    step = store.latest()
    if step is not None:
        recovered = store.read_part(step, "driver", weights_only=False)
    else:
        recovered = _initial_state()
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


def _log_artifacts(tracker: Tracker, run_dir: Path, state: dict[str, Any]) -> None:
    """summary.json, the config, and a PNG of reward and held-out accuracy against iteration."""
    curves = {
        "reward/mean": [(i + 1, h["reward/mean"]) for i, h in enumerate(state["history"]) if "reward/mean" in h],
        "eval/test_accuracy": [(i, a) for i, a in state["evals"]],
    }
    plot = plot_curves(curves, run_dir / "curves.png", title=run_dir.name)
    for path in (run_dir / "summary.json", run_dir / "config.yaml", plot):
        tracker.log_artifact(path)


def len_train(cfg: Config) -> int:
    """Number of train prompts, or of DPO's train pairs (cheap: the arithmetic generator is fast)."""
    from dockflow.data import load_task
    from dockflow.data.preferences import preference_splits

    task = load_task(cfg.data, cfg.run.seed)
    if cfg.algorithm.name == "dpo":
        return len(preference_splits(cfg.algorithm.dpo, task, cfg.run.seed)[0])
    return len(task.train)


def _summary(cfg: Config, state: dict[str, Any], init: dict[str, float], run_id: str, wall: float) -> dict[str, Any]:
    hist = state["history"]
    tps = [h["perf/throughput_tps"] for h in hist]
    evals = state["evals"]
    scores = state.get("eval_scores", [])
    extra = {}
    if cfg.algorithm.name == "dpo" and scores:
        extra["margin_before"] = scores[0][1]["eval/dpo_margin"] if scores[0][0] == 0 else None
        extra["margin_after"] = scores[-1][1]["eval/dpo_margin"]
    return {
        "run_name": cfg.run.name,
        "algorithm": cfg.algorithm.name,
        "samples_trained": state.get("samples", 0),
        "restarts": state.get("restarts", 0),
        "accuracy_before": evals[0][1] if evals and evals[0][0] == 0 else None,
        "accuracy_after": evals[-1][1] if evals else None,
        "iterations": state["iteration"],
        "throughput_tps": sum(tps) / len(tps) if tps else 0.0,
        "wall_seconds": wall,
        "mlflow_run_id": run_id,
        "evals": [{"iteration": i, "accuracy": sc["eval/test_accuracy"], **sc} for i, sc in scores] or [{"iteration": i, "accuracy": a} for i, a in evals],
        "reward_per_iteration": [h["reward/mean"] for h in hist if "reward/mean" in h],
        "seconds_per_iteration": sum(h["timing/iteration_s"] for h in hist) / len(hist) if hist else 0.0,
        **extra,
        **{k: v for k, v in init.items()},
    }
