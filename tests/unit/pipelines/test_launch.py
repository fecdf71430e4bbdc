"""Submitting and scheduling: the cron check, a clear error for an unreachable host, and the recurring-run
request kfp.Client really sends, recorded by a local HTTP endpoint."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dockflow.config import load_config
from pipelines import launch


class Recorder(BaseHTTPRequestHandler):
    """Answers the KFP v2beta1 API calls kfp.Client makes for a recurring run, and records each request."""

    requests: list[tuple[str, str, dict]] = []

    def _reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else {}
        self.requests.append((self.command, self.path, body))
        return body

    def do_GET(self):  # noqa: N802 - http.server's naming
        self._record()
        if self.path.startswith("/apis/v2beta1/experiments"):
            self._reply({"experiments": [], "total_size": 0})  # no such experiment yet: the client creates it
        else:
            self._reply({})

    def do_POST(self):  # noqa: N802
        body = self._record()
        if self.path == "/apis/v2beta1/experiments":
            self._reply({**body, "experiment_id": "exp-1"})
        elif self.path == "/apis/v2beta1/recurringruns":
            self._reply({**body, "recurring_run_id": "rr-1"})
        else:
            self._reply({})

    def log_message(self, *args):
        pass


@pytest.fixture
def kfp_api():
    Recorder.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", Recorder.requests
    server.shutdown()
    server.server_close()


@pytest.mark.filterwarnings("ignore:This client only works:FutureWarning")
def test_schedule_sends_cron_parameters_and_the_pipeline_spec(kfp_api, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # kfp.Client reads its context file from there
    host, requests = kfp_api
    overrides = [f"run.output_dir={tmp_path}"]
    cfg = load_config("configs/grpo_arith.yaml", overrides)
    params = launch.arguments("configs/grpo_arith.yaml", overrides, cfg, s3_bucket="ckpt", image="",
                              continue_from="champion", iterations=300)
    job = launch.schedule(host, "0 0 2 * * *", params, launch.options_for(cfg), "nightly", "grpo-nightly",
                          tmp_path / "p.yaml")
    assert job == "rr-1"
    paths = [(m, p.split("?")[0]) for m, p, _ in requests]
    assert ("GET", "/apis/v2beta1/healthz") in paths and ("POST", "/apis/v2beta1/experiments") in paths
    body = next(b for m, p, b in requests if (m, p) == ("POST", "/apis/v2beta1/recurringruns"))
    assert body["trigger"]["cron_schedule"]["cron"] == "0 0 2 * * *"
    assert body["display_name"] == "grpo-nightly" and body["experiment_id"] == "exp-1"
    assert body["mode"] == "ENABLE" and int(body["max_concurrency"]) == 1
    # No run_name: every night's run is named after its own KFP run id; it starts from the champion.
    assert body["runtime_config"]["parameters"] == {
        "config": "configs/grpo_arith.yaml", "overrides": overrides, "iterations": 300, "max_staleness": 0,
        "eval_every": 100, "checkpoint_every": 10, "continue_from": "champion", "s3_bucket": "ckpt",
    }
    spec = body["pipeline_spec"]["pipeline_spec"]
    executors = body["pipeline_spec"]["platform_spec"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert all(e["secretAsEnv"] for e in executors.values())  # the Kubernetes settings travel with it
    assert spec["pipelineInfo"]["name"] == "dockflow-rl"
    tasks = next(c for n, c in spec["components"].items() if n.startswith("comp-exit-handler"))["dag"]["tasks"]
    assert {t["taskInfo"]["name"] for t in tasks.values()} == {"setup", "generate", "infer", "update", "reshard",
                                                               "evaluate", "finish"}


def test_unknown_parameters_are_refused():
    cfg = load_config("configs/grpo_arith.yaml")
    with pytest.raises(launch.LaunchError, match="unknown pipeline parameters"):
        launch.arguments("configs/grpo_arith.yaml", [], cfg, iteratons=3)


def test_bad_cron_and_unreachable_host_are_clear_errors():
    with pytest.raises(launch.LaunchError, match="has 5 fields; KFP wants 6"):
        launch.check_cron("0 2 * * *")
    with pytest.raises(launch.LaunchError, match=r"cannot reach Kubeflow Pipelines at http://127\.0\.0\.1:9"):
        launch.check_host("http://127.0.0.1:9")
