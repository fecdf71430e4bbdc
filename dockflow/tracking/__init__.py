"""MLflow tracking: one run per DockFlow run (params, metrics, artifacts, tags, optional system metrics), curve
plots, metric read-back; run comparison lives in ``dockflow.tracking.compare``.

    from dockflow.tracking import Tracker, plot_curves, run_tags
    with Tracker.start(cfg.tracking, run_dir, cfg.run.name, params=cfg.flat(), tags=run_tags(cfg)) as tr:
        tr.log_metrics({"train/reward_mean": r}, step=it)
"""

from dockflow.tracking.mlflow_tracker import Tracker, flatten_params, read_metric_history
from dockflow.tracking.plots import plot_curves
from dockflow.tracking.store import TrackingError, resolve_tracking_uri
from dockflow.tracking.tags import run_tags

__all__ = [
    "Tracker",
    "TrackingError",
    "flatten_params",
    "plot_curves",
    "read_metric_history",
    "resolve_tracking_uri",
    "run_tags",
]
