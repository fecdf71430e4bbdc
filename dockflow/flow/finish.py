"""The end of a successful run, for both drivers: final model, summary, MLflow artifacts, Model Registry.

The final model is staged in the checkpoint store (``<store>/final_model``: a directory, or MinIO/S3), so it
never lives on one worker's disk alone. With ``registry.model_name`` set it becomes a new version of that
registered model (files in the MLflow artifact store, which checkpoint retention never touches), and takes the
champion alias only when its held-out score beats the champion's by more than ``registry.champion_margin``
(``dockflow.tracking.registry``); both scores and the decision go to the run's MLflow metrics and the summary.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dockflow.config import Config
from dockflow.flow import record
from dockflow.flow.run_record import RunRecord
from dockflow.flow.waiting import wait_stages
from dockflow.tracking import Tracker, plot_curves
from dockflow.workers import Workers

FINAL_MODEL = "final_model"


def finish(cfg: Config, run_dir: Path, workers: Workers, store: Any, tracker: Tracker, state: RunRecord, *,
           model_uri: str, wall_s: float) -> dict[str, Any]:
    """Stage the final model, write ``summary.json``, log it with the curves and the config, register the model."""
    final = f"{store.location()}/{FINAL_MODEL}"
    wait_stages({"save_final": workers.actor.save_final.remote(final)}, cfg.train.stage_timeout_s, state.iteration)
    out = record.summary(cfg, state, tracker.run_id, wall_s)
    out.update({"final_model": final, "initial_model": model_uri, "checkpoints": store.location()})
    if cfg.registry.model_name:
        out["registry"] = register(cfg, tracker, final, final_score(cfg, state))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps(out, indent=2))
    tracker.flush_deferred(run_dir / "metrics_unsent.jsonl")
    tracker.set_tags({"final_model": final, "checkpoint_uri": store.location()})  # pointers, not copies
    log_artifacts(tracker, run_dir, state)
    return out


def final_score(cfg: Config, state: RunRecord) -> float:
    """The final evaluation's ``registry.score_metric`` (NaN when the run has none: it never wins)."""
    scores = state.final_scores()
    return math.nan if scores is None else float(scores.get(cfg.registry.score_metric, math.nan))


def register(cfg: Config, tracker: Tracker, final_uri: str, score: float) -> dict[str, Any]:
    """A new registered version of the final model, then the champion decision; both logged to the run."""
    from dockflow.storage.objects import fetch_model
    from dockflow.tracking.registry import decide_champion, decision_metrics, register_final_model

    local = fetch_model(final_uri, cfg.checkpoint)
    version = register_final_model(tracker.tracking_uri, cfg.registry, tracker.run_id, local, score)
    decision = decide_champion(tracker.tracking_uri, cfg.registry, version, score)
    metrics, tags = decision_metrics(decision)
    tracker.log_metrics(metrics, step=cfg.train.iterations)
    tracker.set_tags(tags)
    return {"model_name": cfg.registry.model_name, "version": version, "score": score,
            "champion_moved": decision.moved, "champion_version": decision.champion_version,
            "previous_champion_version": decision.previous_version, "previous_champion_score": decision.previous_score,
            "decision": decision.reason}


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
