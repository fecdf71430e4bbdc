"""Optional system metrics (``tracking.system_metrics: true``): MLflow's SystemMetricsMonitor on one run.

A background thread samples CPU, memory, disk, network (and NVIDIA/AMD GPU where their libraries are
present) every ``tracking.system_metrics_interval_s`` seconds and logs ``system/...`` metrics to the run by
its id, never through MLflow's global active run. Its step counts samples, not RL iterations.

    monitor = start_system_metrics(uri, run_id, interval_s=10.0)
    ...
    monitor.finish()   # flushes; Tracker.end does this before ending the run
"""

from __future__ import annotations

from typing import Any

from dockflow.tracking.store import TrackingError


def start_system_metrics(uri: str, run_id: str, interval_s: float, resume: bool = False) -> Any:
    """Start a ``SystemMetricsMonitor`` logging to ``run_id`` at ``uri``; ``resume`` continues its step count."""
    try:
        import psutil  # noqa: F401 - the CPU, memory and disk monitors need it
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    except ImportError as exc:
        raise TrackingError(
            f"tracking.system_metrics needs psutil ({exc}): install it (pip install psutil) or set "
            "tracking.system_metrics: false"
        ) from None
    monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, resume_logging=resume, tracking_uri=uri)
    monitor.start()
    return monitor
