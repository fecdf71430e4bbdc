"""Tracker against the local SQLite store: params, metrics, artifacts, run status, resume, errors."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from dockflow.config import TrackingConfig, load_config
from dockflow.tracking import Tracker, TrackingError, mlflow_tracker, read_metric_history


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Tracker]:
    """One run in the default store (creating a SQLite store costs seconds, so the module shares it)."""
    run_dir = tmp_path_factory.mktemp("run")
    tracker = Tracker.start(TrackingConfig(), run_dir, "unit", params={"run": {"seed": 3}}, tags={"kind": "unit"})
    yield run_dir, tracker
    tracker.end()


def test_default_store_is_sqlite_in_run_dir(default_run: tuple[Path, Tracker]) -> None:
    run_dir, tracker = default_run
    assert tracker.tracking_uri == f"sqlite:///{run_dir.absolute() / 'mlflow.db'}"
    assert (run_dir / "mlflow.db").is_file()
    run = MlflowClient(tracker.tracking_uri).get_run(tracker.run_id)
    assert run.info.run_name == "unit" and run.info.status == "RUNNING"
    assert run.data.params["run.seed"] == "3"
    assert run.data.tags["kind"] == "unit"
    (run_dir / "curves.png").write_bytes(b"\x89PNG fake")
    tracker.log_artifact(run_dir / "curves.png")
    tracker.log_dict({"accuracy": 0.5}, "summary.json")
    tracker.log_text("hello", "notes/hello.txt")
    art = run_dir / "mlartifacts" / tracker.run_id / "artifacts"
    assert (art / "curves.png").read_bytes() == b"\x89PNG fake"
    assert (art / "summary.json").read_text().strip().startswith("{")
    assert (art / "notes" / "hello.txt").read_text() == "hello"
    with pytest.raises(TrackingError, match="does not exist"):
        tracker.log_artifact(run_dir / "missing.png")


def test_params_in_batches_and_truncated(default_run: tuple[Path, Tracker], caplog: pytest.LogCaptureFixture) -> None:
    run_dir, first = default_run
    params = {f"section{i // 50}.key{i}": i for i in range(250)}  # more than one 100-param batch
    params["long"] = "x" * 7000
    cfg = TrackingConfig(uri=first.tracking_uri)
    with caplog.at_level(logging.WARNING), Tracker.start(cfg, run_dir, "p", params) as tr:
        got = MlflowClient(tr.tracking_uri).get_run(tr.run_id).data.params
    assert len(got) == 251
    assert got["section4.key249"] == "249"
    assert len(got["long"]) == 6000 and got["long"].endswith("...")
    assert "truncating" in caplog.text


def test_metrics_skip_non_finite(default_run: tuple[Path, Tracker], caplog: pytest.LogCaptureFixture) -> None:
    _, tracker = default_run
    with caplog.at_level(logging.WARNING):
        assert tracker.log_metrics({"train/reward_mean": 0.25, "train/loss": float("nan")}, step=1) == 1
        assert tracker.log_metrics({"train/reward_mean": 0.5, "timing/iter_s": float("inf")}, step=2) == 1
    assert "train/loss is nan at step 1" in caplog.text and "timing/iter_s is inf" in caplog.text
    assert tracker.metric_history("train/reward_mean") == [(1, 0.25), (2, 0.5)]
    assert read_metric_history(tracker.tracking_uri, tracker.run_id, "train/loss") == []
    with pytest.raises(TypeError, match="'train/x' must be a number"):
        tracker.log_metrics({"train/x": "high"}, step=3)


def test_trackers_coexist_without_global_state(default_run: tuple[Path, Tracker]) -> None:
    run_dir, first = default_run
    cfg = TrackingConfig(uri=first.tracking_uri)
    a = Tracker.start(cfg, run_dir, "a")
    with pytest.raises(RuntimeError, match="boom"), Tracker.start(cfg, run_dir, "b") as b:
        a.log_metrics({"eval/accuracy": 0.1}, step=0)
        b.log_metrics({"eval/accuracy": 0.9}, step=0)
        raise RuntimeError("boom")
    a.end()
    a.end()  # a second end is a no-op
    assert mlflow.active_run() is None
    client = MlflowClient(first.tracking_uri)
    assert a.run_id != b.run_id
    assert client.get_run(a.run_id).info.status == "FINISHED"
    assert client.get_run(b.run_id).info.status == "FAILED"
    assert client.get_run(b.run_id).data.metrics["eval/accuracy"] == 0.9


def test_resume_reopens_run(default_run: tuple[Path, Tracker], caplog: pytest.LogCaptureFixture) -> None:
    run_dir, first = default_run
    cfg = TrackingConfig(uri=first.tracking_uri)
    with Tracker.start(cfg, run_dir, "r", params={"train.lr": 0.1}) as tr:
        tr.log_metrics({"train/reward_mean": 1.0}, step=1)
    resumed = Tracker.start(cfg, run_dir, "r", params={"train.lr": 0.2, "new": 1}, run_id=tr.run_id)
    with caplog.at_level(logging.WARNING), resumed as again:
        assert MlflowClient(cfg.uri).get_run(again.run_id).info.status == "RUNNING"
        again.log_metrics({"train/reward_mean": 2.0}, step=2)
    assert "train.lr changed" in caplog.text
    run = MlflowClient(cfg.uri).get_run(tr.run_id)
    assert run.data.params["train.lr"] == "0.1" and run.data.params["new"] == "1"
    assert again.metric_history("train/reward_mean") == [(1, 1.0), (2, 2.0)]
    assert run.info.status == "FINISHED"


def test_bad_uri_errors_name_the_uri(tmp_path: Path) -> None:
    with pytest.raises(TrackingError, match=r"tracking.uri 'nosuch://x' cannot be used .*use http"):
        Tracker.start(TrackingConfig(uri="nosuch://x"), tmp_path, "bad")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(TrackingError, match=r"cannot create directory .*a_file/run"):
        Tracker.start(TrackingConfig(), blocker / "run", "bad")


def test_rejected_requests_name_the_problem(default_run: tuple[Path, Tracker]) -> None:
    run_dir, tracker = default_run
    with pytest.raises(TrackingError, match=r"logging metrics for run \w+: MLflow at sqlite.* rejected the request"):
        tracker.log_metrics({"train/bad key!": 1.0}, step=0)
    with pytest.raises(TrackingError, match="run 0123abcd does not exist in sqlite"):
        Tracker.start(TrackingConfig(uri=tracker.tracking_uri), run_dir, "r", run_id="0123abcd")


def test_an_outage_defers_metrics_and_nothing_is_lost(default_run: tuple[Path, Tracker], monkeypatch) -> None:
    run_dir, tracker = default_run
    real = tracker._client.log_batch
    down = {"on": True}

    def flaky(*args, **kwargs):
        if down["on"]:
            raise ConnectionError("connection refused")
        return real(*args, **kwargs)

    monkeypatch.setattr(tracker._client, "log_batch", flaky)
    monkeypatch.setattr(tracker, "_flush_every_s", 0.0)  # a write per call, as with tracking.flush_every_s: 0
    monkeypatch.setattr(mlflow_tracker, "OUTAGE_RETRY_S", 0.0)  # no backoff between tries (tested below)
    for name, value in (("_deferred", []), ("_failures", 0), ("_retry_at", 0.0)):  # the shared tracker's outage
        monkeypatch.setattr(tracker, name, value)  # state is put back after the test
    assert not tracker.log_metrics_or_defer({"outage/x": 1.0}, step=1)
    assert not tracker.log_metrics_or_defer({"outage/x": 2.0}, step=2)
    down["on"] = False
    assert tracker.log_metrics_or_defer({"outage/x": 3.0}, step=3)  # the held steps go out first
    assert tracker.metric_history("outage/x") == [(1, 1.0), (2, 2.0), (3, 3.0)]
    down["on"] = True
    tracker.log_metrics_or_defer({"outage/y": 4.0}, step=4)
    spill = run_dir / "unsent.jsonl"
    assert tracker.flush_deferred(spill, wait_s=0.0) == 1
    assert '"outage/y": 4.0' in spill.read_text()


def test_an_outage_is_retried_with_backoff_and_the_buffer_is_bounded(
    default_run: tuple[Path, Tracker], monkeypatch
) -> None:
    """During an outage the loop tries once per backoff interval, not per iteration; steps beyond
    MAX_DEFERRED_STEPS go to the spill file, oldest first, with their stamps."""
    run_dir, tracker = default_run
    calls = []

    def down(*args, **kwargs):
        calls.append(1)
        raise ConnectionError("connection refused")

    monkeypatch.setattr(tracker._client, "log_batch", down)
    monkeypatch.setattr(tracker, "_flush_every_s", 0.0)
    monkeypatch.setattr(mlflow_tracker, "MAX_DEFERRED_STEPS", 3)
    monkeypatch.setattr(tracker, "spill_to", run_dir / "held.jsonl")
    for name, value in (("_deferred", []), ("_failures", 0), ("_retry_at", 0.0)):
        monkeypatch.setattr(tracker, name, value)
    for step in range(1, 6):
        assert not tracker.log_metrics_or_defer({"bounded/x": float(step)}, step=step)
    assert len(calls) == 1, "a failed send is retried only after OUTAGE_RETRY_S"
    assert [step for step, _ in tracker._deferred] == [3, 4, 5]
    spilled = [json.loads(line) for line in (run_dir / "held.jsonl").read_text().splitlines()]
    assert [(r["step"], r["metrics"]) for r in spilled] == [(1, {"bounded/x": 1.0}), (2, {"bounded/x": 2.0})]
    assert all(r["timestamp_ms"] > 0 for r in spilled)
    assert not tracker.flush() and len(calls) == 2  # a checkpoint's flush always tries


def test_the_loops_metrics_go_out_in_one_batch_per_flush_interval(default_run: tuple[Path, Tracker], monkeypatch) -> None:
    _, tracker = default_run
    calls = []
    real = tracker._client.log_batch
    monkeypatch.setattr(tracker._client, "log_batch", lambda *a, **k: calls.append(len(k["metrics"])) or real(*a, **k))
    monkeypatch.setattr(tracker, "_flush_every_s", 3600.0)
    monkeypatch.setattr(tracker, "_sent_at", time.monotonic())
    before = int(time.time() * 1000)
    for step in range(1, 4):
        assert tracker.log_metrics_or_defer({"held/a": float(step), "held/b": 2.0 * step}, step=step)
    assert calls == [] and tracker.metric_history("held/a") == []  # held: no write per iteration
    with pytest.raises(TypeError, match="'held/c' must be a number"):
        tracker.log_metrics_or_defer({"held/c": "x"}, step=4)  # a bad value fails where it is logged, not later
    assert tracker.flush()
    assert calls == [6]  # three steps, one request
    assert tracker.metric_history("held/b") == [(1, 2.0), (2, 4.0), (3, 6.0)]
    stamps = [m.timestamp for m in tracker._client.get_metric_history(tracker.run_id, "held/a")]
    assert min(stamps) >= before  # stamped when logged


def test_ending_a_run_sends_the_metrics_it_still_holds(default_run: tuple[Path, Tracker]) -> None:
    run_dir, shared = default_run
    tracker = Tracker.start(TrackingConfig(uri=shared.tracking_uri, flush_every_s=3600.0), run_dir, "held")
    tracker.log_metrics_or_defer({"held/x": 1.0}, step=1)
    assert tracker.metric_history("held/x") == []
    tracker.end("FAILED")  # a run that fails still logs what it measured
    assert tracker.metric_history("held/x") == [(1, 1.0)]


def test_params_and_tags_show_no_password(default_run: tuple[Path, Tracker]) -> None:
    """A credentialed tracking.uri (and any URI value) reaches MLflow's params and tags redacted (dockflow.redact)."""
    run_dir, first = default_run
    secret, uri = "s3cr3t-PW", "https://ann:s3cr3t-PW@mlflow.example:5000"
    cfg = load_config(None, [f"tracking.uri={uri}", f"model.path={uri}/model"])
    tracker = Tracker.start(TrackingConfig(uri=first.tracking_uri), run_dir, "redacted", params=cfg.flat(),
                            tags={"model": cfg.model.path})
    tracker.set_tags({"final_model": f"{uri}/final"})
    run = MlflowClient(tracker.tracking_uri).get_run(tracker.run_id)
    tracker.end()
    shown = {**run.data.params, **run.data.tags}
    assert shown["tracking.uri"] == "https://ann:***@mlflow.example:5000"
    assert shown["final_model"] == "https://ann:***@mlflow.example:5000/final"
    assert not [k for k, v in shown.items() if secret in v]


OPEN_AT = """
import sys, time
from pathlib import Path
from dockflow.config import TrackingConfig
from dockflow.tracking import Tracker
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
Tracker.start(TrackingConfig(), Path(sys.argv[1]), sys.argv[3]).end()
"""


def test_two_runs_that_create_one_store_at_once_both_start(tmp_path: Path) -> None:
    """Two processes (threads do not race: MLflow caches a store per URI) create the default store at the same
    moment. Unlocked, MLflow's migrations of the new tables collide in one or both
    (``table _alembic_tmp_params already exists``); the lock beside the file makes them take turns."""
    import subprocess
    import sys

    start_at = str(time.time() + 4.0)  # both past their imports (about 2 s each on 2 busy cores)
    runs = [subprocess.Popen([sys.executable, "-c", OPEN_AT, str(tmp_path), start_at, f"run{i}"],
                             stderr=subprocess.PIPE, text=True) for i in range(2)]
    errors = [err.strip().splitlines()[-1:] for p in runs if (err := p.communicate(timeout=120)[1]) and p.returncode]
    assert errors == []
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    names = {r.info.run_name for r in client.search_runs([client.get_experiment_by_name("dockflow").experiment_id])}
    assert names == {"run0", "run1"}
