"""The end of a successful run, for both drivers: final model, summary, MLflow artifacts, Model Registry.

The final model is staged in the checkpoint store (``<store>/final_model``: a directory, or MinIO/S3), so it
never lives on one worker's disk alone. The run's MLflow run is tagged with the identity of its evaluation and
its lineage (``dockflow.tracking.tags.identity_tags``). With ``registry.model_name`` set the final model becomes
a new version of that registered model (files in the MLflow artifact store, which checkpoint retention never
touches) carrying the same tags, and the champion gate (``dockflow.tracking.champion``) decides whether it takes
the champion alias: only against a champion of the same task and base model, comparing like with like (the
champion re-scored on this run's evaluation by the actor when the evaluations differ); the scores compared and
the decision go to the run's MLflow metrics and tags, the version's description and the summary.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dockflow.algos import recipe_of
from dockflow.config import Config
from dockflow.flow.run_record import ACCURACY, RunRecord
from dockflow.flow.waiting import wait_stages
from dockflow.redact import redact_config
from dockflow.tracking import Tracker, plot_curves
from dockflow.tracking.champion import Rescorer, decide_champion, decision_metrics
from dockflow.tracking.tags import identity_tags
from dockflow.workers import Workers

FINAL_MODEL = "final_model"
SPLIT = "test"  # the split the run's evaluations score (flow.iteration: RunTasks._evaluate)


def finish(cfg: Config, run_dir: Path, workers: Workers, store: Any, tracker: Tracker, state: RunRecord, *,
           model_uri: str, wall_s: float) -> dict[str, Any]:
    """Stage the final model, write ``summary.json``, log it with the curves and the config, register the model."""
    final = f"{store.location()}/{FINAL_MODEL}"
    timeout, step = cfg.train.stage_timeout_s, state.iteration
    got = wait_stages({"save_final": workers.actor.save_final.remote(final),
                       "eval_identity": workers.actor.identity.remote(SPLIT, cfg.eval.num_prompts)}, timeout, step)
    ident, task = got["eval_identity"]
    base = base_model(cfg, state, tracker.tracking_uri)
    tags = identity_tags(ident.fingerprint, ident.fields(), task, base)
    tracker.set_tags(tags)
    out = summary(cfg, state, tracker.run_id, wall_s)
    out.update({"final_model": final, "initial_model": model_uri, "checkpoints": store.location(),
                "evaluation": {"fingerprint": ident.fingerprint, **ident.fields()},
                "lineage": {"task": task, "base_model": base}})
    if cfg.registry.model_name:
        rescore = champion_rescorer(cfg, workers, tracker.tracking_uri)
        out["registry"] = register(cfg, tracker, final, final_score(cfg, state), tags=tags, rescore=rescore)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps(redact_config(out), indent=2))
    tracker.flush_deferred(run_dir / "metrics_unsent.jsonl")
    tracker.set_tags({"final_model": final, "checkpoint_uri": store.location()})  # pointers, not copies
    log_artifacts(tracker, run_dir, state)
    return out


def final_score(cfg: Config, state: RunRecord) -> float:
    """The final evaluation's ``registry.score_metric`` (NaN when the run has none: it never wins)."""
    scores = state.final_scores()
    return math.nan if scores is None else float(scores.get(cfg.registry.score_metric, math.nan))


def base_model(cfg: Config, state: RunRecord, tracking_uri: str) -> str:
    """The run's base model (``dockflow.models.base_model_identity``); a run that started from a registered version takes
    that version's own, so a chain of recurring runs keeps one lineage."""
    from dockflow.models.base_model_identity import base_model_identity

    if cfg.model.continue_from == "base":
        return base_model_identity(cfg.model)
    from dockflow.tracking.registry import model_version_tags
    from dockflow.tracking.tags import BASE_MODEL_TAG

    start = state.init_metrics.get("registry/start_version")
    if start is None or not math.isfinite(start):
        return "unknown (started from the registry; its version was not recorded)"
    version = int(start)
    own = model_version_tags(tracking_uri, cfg.registry, version).get(BASE_MODEL_TAG)
    return own or f"unknown (started from v{version} of '{cfg.registry.model_name}', which has no lineage tag)"


def champion_rescorer(cfg: Config, workers: Workers, tracking_uri: str) -> Rescorer:
    """Score a champion version on this run's evaluation: the actor downloads it on its node and scores it with
    the run's own evaluation code, examples and inputs (``ActorWorker.score_registered``)."""

    def rescore(champion: int) -> tuple[float, str]:
        ref = workers.actor.score_registered.remote(tracking_uri, champion, SPLIT, cfg.eval.num_prompts)
        done = wait_stages({"rescore_champion": ref}, cfg.train.stage_timeout_s, cfg.train.iterations)
        return done["rescore_champion"]

    return rescore


def register(cfg: Config, tracker: Tracker, final_uri: str, score: float, *, tags: dict[str, str],
             rescore: Rescorer | None = None) -> dict[str, Any]:
    """A new registered version of the final model tagged with ``tags``, then the champion decision (a champion
    evaluated otherwise is re-scored by ``rescore``); both logged to the run. Returns the summary's part."""
    from dockflow.storage.objects import fetch_model
    from dockflow.tracking.registry import register_final_model

    local = fetch_model(final_uri, cfg.checkpoint)
    uri = tracker.tracking_uri
    version = register_final_model(uri, cfg.registry, tracker.run_id, local, score, tags=tags)
    decision = decide_champion(uri, cfg.registry, version, score, rescore=rescore)
    metrics, run_tags = decision_metrics(decision)
    tracker.log_metrics(metrics, step=cfg.train.iterations)
    tracker.set_tags(run_tags)
    return {"model_name": cfg.registry.model_name, "version": version, "score": score,
            "champion_moved": decision.moved, "champion_version": decision.champion_version,
            "previous_champion_version": decision.previous_version, "previous_champion_score": decision.previous_score,
            "fingerprint": decision.fingerprint, "champion_fingerprint": decision.champion_fingerprint,
            "comparison": decision.comparison, "compared_score": decision.compared_score,
            "compared_on": decision.compared_on, "compared": decision.compared(), "decision": decision.reason}


def log_artifacts(tracker: Tracker, run_dir: Path, state: RunRecord) -> None:
    """summary.json, the config, and a PNG of reward and held-out accuracy against iteration."""
    curves = {
        "reward/mean": [(i + 1, h["reward/mean"]) for i, h in enumerate(state.history) if "reward/mean" in h],
        "eval/test_accuracy": state.accuracies,
    }
    plot = plot_curves(curves, run_dir / "curves.png", title=run_dir.name)
    for path in (run_dir / "summary.json", run_dir / "config.yaml", plot):
        if Path(path).is_file():
            tracker.log_artifact(path)


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
