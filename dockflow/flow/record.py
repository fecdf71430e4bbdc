"""What the driver does with its record of a run (``RunRecord``, ``dockflow.flow.run_record``), for both drivers
(the CLI loop and the KFP pipeline's tasks): when to evaluate and checkpoint, the checkpoint's "driver" part
(``commit_checkpoint``, ``read_record``), and ``summary``, what ``summary.json`` holds (``dockflow.flow.finish``
writes it with the final model).
"""

from __future__ import annotations

from typing import Any

from dockflow.algos import recipe_of
from dockflow.config import Config
from dockflow.flow import worker_calls
from dockflow.flow.run_record import ACCURACY, RunRecord
from dockflow.flow.waiting import wait_stages
from dockflow.workers import Workers


def eval_due(cfg: Config, step: int) -> bool:
    every = cfg.eval.every
    return step == cfg.train.iterations or (every > 0 and step % every == 0)


def ckpt_due(cfg: Config, step: int) -> bool:
    every = cfg.checkpoint.every
    return step == cfg.train.iterations or (every > 0 and step % every == 0)


def stateful(workers: Workers) -> dict[str, Any]:
    """Workers whose state a checkpoint holds (each writes its own part; the actor ranks, and the critic ranks, save
    and load together: rank 0 writes the "actor" ("critic") part, every rank reads it)."""
    named = {"actor": workers.actor, "critic": workers.critic}
    named.update({f"actor-{k}": a for k, a in enumerate(worker_calls.actor_ranks(workers)) if k > 0})
    named.update({f"critic-{k}": c for k, c in enumerate(worker_calls.critic_ranks(workers)) if k > 0})
    return {k: v for k, v in named.items() if v is not None}


def commit_checkpoint(store, step: int, rec: RunRecord, cfg: Config) -> None:
    """After the workers wrote their parts: the driver's record and the config, then the manifest (the commit)."""
    store.write_part(step, "driver", rec.to_dict())
    store.write_part(step, "config", cfg.model_dump())  # what produced it, readable without the run directory
    store.commit(step, {"iteration": step, "accuracy": rec.last_accuracy})


def read_record(store, step: int) -> RunRecord:
    """The driver's record in checkpoint ``step`` (written by this DockFlow or the one before: ``RunRecord.from_dict``)."""
    return RunRecord.from_dict(store.read_part(step, "driver", weights_only=False))


def restore_workers(store, workers: Workers, step: int, cfg: Config) -> None:
    refs = {f"restore_{k}": w.load.remote(store, step) for k, w in stateful(workers).items()}
    wait_stages(refs, cfg.train.stage_timeout_s, step)


def summary(cfg: Config, rec: RunRecord, run_id: str, wall: float) -> dict[str, Any]:
    """What ``summary.json`` holds: scores before and after, samples trained, throughput, per-iteration rewards."""
    hist = rec.history
    tps = [h["perf/throughput_tps"] for h in hist]
    accuracies = rec.accuracies
    extra = recipe_of(cfg.algorithm.name).summary(rec.evals)  # e.g. DPO's held-out margins
    return {
        "run_name": cfg.run.name,
        "algorithm": cfg.algorithm.name,
        "samples_trained": rec.samples,
        "restarts": rec.restarts,
        "resumed_from": rec.resumed_from,
        "accuracy_before": accuracies[0][1] if accuracies and accuracies[0][0] == 0 else None,
        "accuracy_after": rec.last_accuracy,
        "iterations": rec.iteration,
        "throughput_tps": sum(tps) / len(tps) if tps else 0.0,
        "wall_seconds": wall,
        "mlflow_run_id": run_id,
        "evals": [{"iteration": i, "accuracy": sc[ACCURACY], **sc} for i, sc in rec.evals],
        "reward_per_iteration": [h["reward/mean"] for h in hist if "reward/mean" in h],
        "seconds_per_iteration": sum(h["timing/iteration_s"] for h in hist) / len(hist) if hist else 0.0,
        **extra,
        **rec.init_metrics,
    }
