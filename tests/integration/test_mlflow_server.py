"""Tracker against a real MLflow tracking server on loopback (the session's ``mlflow_server`` fixture,
``tests/fixtures/mlflow_server.py``), and the error for an unreachable one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fixtures.mlflow_server import free_port
from mlflow.tracking import MlflowClient

from dockflow.config import TrackingConfig
from dockflow.tracking import Tracker, TrackingError, plot_curves, read_metric_history


def test_tracker_round_trip_through_server(mlflow_server: str, tmp_path: Path) -> None:
    cfg = TrackingConfig(uri=mlflow_server, experiment="integration")
    params = {f"k{i}": i for i in range(130)}
    with Tracker.start(cfg, tmp_path, "server-run", params=params, tags={"suite": "integration"}) as tr:
        for step in range(1, 4):
            tr.log_metrics({"train/reward_mean": step / 10, "eval/accuracy": float("nan")}, step=step)
        png = plot_curves({"train/reward_mean": tr.metric_history("train/reward_mean")}, tmp_path / "curves.png")
        tr.log_artifact(png)
        tr.log_dict({"final": 0.3}, "summary.json")
    client = MlflowClient(mlflow_server)
    run = client.get_run(tr.run_id)
    assert run.info.status == "FINISHED"
    assert len(run.data.params) == 130 and run.data.tags["suite"] == "integration"
    assert read_metric_history(mlflow_server, tr.run_id, "train/reward_mean") == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert "eval/accuracy" not in run.data.metrics
    assert sorted(a.path for a in client.list_artifacts(tr.run_id)) == ["curves.png", "summary.json"]
    downloaded = Path(client.download_artifacts(tr.run_id, "curves.png", str(tmp_path / "dl")))
    assert downloaded.read_bytes() == png.read_bytes()


def test_unreachable_server_fails_fast_with_clear_error(tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # bound then closed: nothing listens there
    t0 = time.monotonic()
    with pytest.raises(TrackingError) as info:
        Tracker.start(TrackingConfig(uri=uri), tmp_path, "nowhere")
    elapsed = time.monotonic() - t0
    assert uri in str(info.value) and "tracking.uri" in str(info.value)
    assert elapsed < 30, f"unreachable server took {elapsed:.1f}s to report"
