"""tracking.system_metrics: MLflow's monitor logs system/... metrics to the run by id, and stops at end."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from dockflow.config import TrackingConfig
from dockflow.tracking import Tracker


def test_system_metrics_follow_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the file store is fast to create
    cfg = TrackingConfig(uri=(tmp_path / "mlruns").as_uri(), system_metrics=True, system_metrics_interval_s=0.1)
    with Tracker.start(cfg, tmp_path, "sys") as tr:
        assert any(t.name == "SystemMetricsMonitor" for t in threading.enumerate())
        deadline = time.monotonic() + 20
        while not MlflowClient(tr.tracking_uri).get_run(tr.run_id).data.metrics and time.monotonic() < deadline:
            time.sleep(0.2)
    assert mlflow.active_run() is None
    assert not any(t.name == "SystemMetricsMonitor" and t.is_alive() for t in threading.enumerate())
    metrics = MlflowClient(tr.tracking_uri).get_run(tr.run_id).data.metrics
    assert "system/cpu_utilization_percentage" in metrics and "system/system_memory_usage_megabytes" in metrics

    off = Tracker.start(TrackingConfig(uri=cfg.uri), tmp_path, "quiet")
    off.end()
    assert not MlflowClient(off.tracking_uri).get_run(off.run_id).data.metrics
