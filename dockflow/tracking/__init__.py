"""MLflow tracking: one run per DockFlow run (params, metrics, artifacts), curve plots, metric read-back.

    from dockflow.tracking import Tracker, plot_curves
    with Tracker.start(cfg.tracking, run_dir, cfg.run.name, params=cfg.flat()) as tr:
        tr.log_metrics({"train/reward_mean": r}, step=it)
"""

from dockflow.tracking.mlflow_tracker import Tracker, flatten_params, read_metric_history
from dockflow.tracking.plots import plot_curves
from dockflow.tracking.store import TrackingError, resolve_tracking_uri

__all__ = ["Tracker", "TrackingError", "flatten_params", "plot_curves", "read_metric_history", "resolve_tracking_uri"]
