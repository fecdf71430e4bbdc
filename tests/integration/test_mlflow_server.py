"""Tracker against a real MLflow tracking server on loopback, and the error for an unreachable one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from dockflow.config import TrackingConfig
from dockflow.tracking import Tracker, TrackingError, plot_curves, read_metric_history

SERVER_START_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"mlflow server at {url} not healthy after {timeout_s}s:\n{log_path.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mlflow_server")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = root / "server.log"
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination", str(root / "artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(url, proc, log_path, SERVER_START_TIMEOUT_S)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server's own process group (it forks uvicorn workers)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


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
    uri = f"http://127.0.0.1:{_free_port()}"  # bound then closed: nothing listens there
    t0 = time.monotonic()
    with pytest.raises(TrackingError) as info:
        Tracker.start(TrackingConfig(uri=uri), tmp_path, "nowhere")
    elapsed = time.monotonic() - t0
    assert uri in str(info.value) and "tracking.uri" in str(info.value)
    assert elapsed < 30, f"unreachable server took {elapsed:.1f}s to report"
