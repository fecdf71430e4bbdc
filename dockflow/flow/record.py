"""The driver's record of a run, shared by both drivers (the CLI loop and the KFP pipeline's tasks).

The record is a plain dict (``initial_state()``): iterations done, per-iteration history, held-out scores,
samples trained, restarts. Checkpoints hold it as their "driver" part; ``summary`` turns it into
``summary.json`` (``dockflow.flow.finish`` writes it with the final model).
"""

from __future__ import annotations

from typing import Any

from dockflow.config import Config
from dockflow.flow import worker_calls
from dockflow.flow.waiting import wait_stages
from dockflow.workers import Workers

HISTORY_KEYS = ("reward/mean", "perf/throughput_tps", "timing/iteration_s")


def initial_state(init_metrics: dict[str, float] | None = None) -> dict[str, Any]:
    """The driver's own state: what a checkpoint needs besides the workers' parts. ``init_metrics``: how the
    initial model was made (SFT accuracy, registry version), for the summary."""
    return {"iteration": 0, "history": [], "evals": [], "samples": 0, "restarts": 0,
            "init_metrics": dict(init_metrics or {})}


def eval_due(cfg: Config, step: int) -> bool:
    every = cfg.eval.every
    return step == cfg.train.iterations or (every > 0 and step % every == 0)


def ckpt_due(cfg: Config, step: int) -> bool:
    every = cfg.checkpoint.every
    return step == cfg.train.iterations or (every > 0 and step % every == 0)


def record_eval(state: dict[str, Any], step: int, scores: dict[str, float]) -> None:
    state["evals"].append((step, scores["eval/test_accuracy"]))
    state.setdefault("eval_scores", []).append((step, scores))


def record_iteration(cfg: Config, state: dict[str, Any], step: int, metrics: dict[str, float]) -> None:
    """Iteration ``step`` is done: history, samples trained (adds ``train/samples``). The position in the data is
    the iteration itself: the prompt order is a function of it (``data/prompt_order.py``)."""
    state["history"].append({k: metrics[k] for k in HISTORY_KEYS if k in metrics})
    state["iteration"] = step
    state["samples"] += cfg.train_batch
    metrics["train/samples"] = float(state["samples"])


def stateful(workers: Workers) -> dict[str, Any]:
    """Workers whose state a checkpoint holds (each writes its own part; the actor ranks save and load together,
    rank 0 writes the "actor" part, every rank reads it)."""
    named = {"actor": workers.actor, "critic": workers.critic}
    named.update({f"actor-{k}": a for k, a in enumerate(worker_calls.actor_ranks(workers)) if k > 0})
    return {k: v for k, v in named.items() if v is not None}


def commit_checkpoint(store, step: int, state: dict[str, Any], cfg: Config) -> None:
    """After the workers wrote their parts: the driver's record and the config, then the manifest (the commit)."""
    store.write_part(step, "driver", state)
    store.write_part(step, "config", cfg.model_dump())  # what produced it, readable without the run directory
    store.commit(step, {"iteration": step, "accuracy": state["evals"][-1][1] if state["evals"] else None})


def restore_workers(store, workers: Workers, step: int, cfg: Config) -> None:
    refs = {f"restore_{k}": w.load.remote(store, step) for k, w in stateful(workers).items()}
    wait_stages(refs, cfg.train.stage_timeout_s, step)


def summary(cfg: Config, state: dict[str, Any], run_id: str, wall: float) -> dict[str, Any]:
    """What ``summary.json`` holds: scores before and after, samples trained, throughput, per-iteration rewards."""
    init = state.get("init_metrics", {})
    hist = state["history"]
    tps = [h["perf/throughput_tps"] for h in hist]
    evals = state["evals"]
    scores = state.get("eval_scores", [])
    extra = cfg.algorithm.recipe.summary(scores)  # e.g. DPO's held-out margins
    return {
        "run_name": cfg.run.name,
        "algorithm": cfg.algorithm.name,
        "samples_trained": state.get("samples", 0),
        "restarts": state.get("restarts", 0),
        "resumed_from": state.get("resumed_from", 0),
        "accuracy_before": evals[0][1] if evals and evals[0][0] == 0 else None,
        "accuracy_after": evals[-1][1] if evals else None,
        "iterations": state["iteration"],
        "throughput_tps": sum(tps) / len(tps) if tps else 0.0,
        "wall_seconds": wall,
        "mlflow_run_id": run_id,
        "evals": [{"iteration": i, "accuracy": sc["eval/test_accuracy"], **sc} for i, sc in scores]
        or [{"iteration": i, "accuracy": a} for i, a in evals],
        "reward_per_iteration": [h["reward/mean"] for h in hist if "reward/mean" in h],
        "seconds_per_iteration": sum(h["timing/iteration_s"] for h in hist) / len(hist) if hist else 0.0,
        **extra,
        **init,
    }
