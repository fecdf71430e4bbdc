"""MLflow tracking: one run per DockFlow run (params, metrics, artifacts, tags, optional system metrics), curve
plots, metric read-back; run comparison lives in ``dockflow.tracking.compare``; the Model Registry (register the
final model, fetch a start) in ``dockflow.tracking.registry``; the champion gate in ``dockflow.tracking.champion``.

    from dockflow.tracking import Tracker, plot_curves, run_tags
    tags = run_tags(cfg.algorithm.name, cfg.model.path, cfg.dock.backend, cfg.run.name)
    with Tracker.start(cfg.tracking, run_dir, cfg.run.name, params=cfg.flat(), tags=tags) as tr:
        tr.log_metrics({"train/reward_mean": r}, step=it)
"""

from dockflow.tracking.champion import ChampionDecision, decide_champion, decision_metrics
from dockflow.tracking.mlflow_tracker import Tracker, flatten_params, read_metric_history
from dockflow.tracking.plots import plot_curves
from dockflow.tracking.registry import (
    FetchedModel,
    RegistryError,
    RegistryLockTimeout,
    fetch_registered_model,
    register_final_model,
)
from dockflow.tracking.store import TrackingError, resolve_tracking_uri
from dockflow.tracking.tags import run_tags

__all__ = [
    "ChampionDecision",
    "FetchedModel",
    "RegistryError",
    "RegistryLockTimeout",
    "Tracker",
    "TrackingError",
    "decide_champion",
    "decision_metrics",
    "fetch_registered_model",
    "flatten_params",
    "plot_curves",
    "read_metric_history",
    "register_final_model",
    "resolve_tracking_uri",
    "run_tags",
]
