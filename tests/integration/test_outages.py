"""Real outages in the middle of a run, against the real servers and processes (nothing monkeypatched):

- the S3 server killed (SIGKILL) during a checkpoint's upload and started again: the run waits within
  ``checkpoint.s3_attempts`` (backoff from ``checkpoint.s3_backoff_s``) and goes on, no checkpoint half-written;
- the MLflow server killed and started again: the run's metrics wait and go out once, none missing or doubled;
- a worker SIGKILLed inside a checkpoint's save, the driver SIGKILLed inside its commit: the checkpoint before
  stays the latest and the resumed run ends bit-identical to an uninterrupted one;
- a full disk (a file-size limit on the worker that saves): one line naming the path, the checkpoint before
  intact;
- two runs racing for the champion alias through the HTTP MLflow server.

One Ray cluster for the module (``outage_cluster``, ``tests/fixtures/outages.py``); each run is the tiny GRPO task
of ``tests/integration/conftest.py``, compared with the single-process loop (``reference``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fixtures.mlflow_server import MlflowServer, free_port
from fixtures.moto_process import MotoProcess
from fixtures.outages import outage_cluster, reference  # noqa: F401 - fixtures
from mlflow.tracking import MlflowClient

from dockflow.config import RegistryConfig, TrackingConfig
from dockflow.flow.trainer import train
from dockflow.flow.waiting import StageError
from dockflow.storage import run_store
from dockflow.storage.objects import fetch_model
from dockflow.tracking import Tracker
from dockflow.tracking.champion import decide_champion
from dockflow.tracking.registry import lock_model_name, register_final_model
from dockflow.tracking.tags import identity_tags

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ITERATIONS = 3  # with checkpoint.every 1: the S3 server dies in checkpoint 2, MLflow is down from 1 to 3
SAME = identity_tags("0123456789abcdef", {}, "arithmetic digits=1 ops=+", "tiny qwen2")  # versions that compete
BUCKET = "outage-bucket"
MLFLOW_BACK_TIMEOUT_S = 60.0  # the restarted MLflow server (its app imported before) answers /health within this


def _final_weights(summary: dict, cfg) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(fetch_model(summary["final_model"], cfg.checkpoint) / "model.safetensors"))


class MlflowOutage:
    """``on_iteration`` hook: SIGKILL the MLflow server when iteration ``down_at`` closes, and start it again
    (from its standby process, so in about a second) when iteration ``back_at`` closes."""

    def __init__(self, server: MlflowServer, down_at: int, back_at: int) -> None:
        self.server, self.down_at, self.back_at = server, down_at, back_at
        self.seen: list[str] = []

    def __call__(self, step: int, metrics: dict) -> None:
        if step == self.down_at:
            self.server.kill()
            self.seen.append("killed")
        if step == self.back_at:
            self.server.start(timeout_s=MLFLOW_BACK_TIMEOUT_S)
            self.seen.append("started")


@pytest.fixture
def own_mlflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """An MLflow server of the outage test's own: it is killed and restarted from a standby process, so the
    session's server, which the other files' tests share, is never touched."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow_outage"), free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_s3_and_mlflow_servers_killed_mid_run(outage_cluster, reference, tiny_config,  # noqa: F811
                                              own_mlflow: MlflowServer, tmp_path: Path, caplog, monkeypatch):
    """The S3 server (moto in its own process, its acknowledged writes journaled so that a restart keeps them,
    as MinIO keeps them on disk) SIGKILLs itself when the actor's part of checkpoint 2 starts to upload; 2 s later
    a new one replays the journal and listens on the same port. The MLflow server (SQLite on disk, so a restart
    keeps it) is SIGKILLed when iteration 1 closes and started again when iteration 3 closes. The run waits out both: every checkpoint
    is committed whole, the killed upload was sent again, each iteration's metrics are in MLflow exactly once,
    and the run computed what the single-process loop computes (the outages changed nothing)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the tracker's own backoff retries (one request)
    moto = MotoProcess(tmp_path, free_port())
    moto.start(kill_on=r"^PUT /outage-bucket/s3-outage/step-000002/actor\.safetensors$")
    standby = moto.standby()  # moto imported while the run goes; listens on go()
    killed: list[int] = []

    def restart_s3() -> None:
        killed.append(moto.wait_killed(timeout_s=600))
        threading.Event().wait(2.0)  # down for 2 s: the upload's tries 2-4 find nothing listening
        standby.go()

    s3_back = threading.Thread(target=restart_s3, daemon=True)
    s3_back.start()
    cfg = tiny_config("s3-outage", ITERATIONS, checkpoint__dir=f"s3://{BUCKET}",
                      checkpoint__s3_endpoint=moto.endpoint, checkpoint__s3_create_bucket=True,
                      checkpoint__s3_attempts=8, checkpoint__every=1, checkpoint__keep=10,
                      tracking__uri=own_mlflow.url, tracking__flush_every_s=0, eval__every=0)
    own_mlflow.standby()
    mlflow_outage = MlflowOutage(own_mlflow, down_at=1, back_at=ITERATIONS)
    try:
        with caplog.at_level(logging.WARNING, logger="dockflow.tracking"):
            summary = train(cfg, on_iteration=mlflow_outage)
        s3_back.join(30)
        store = run_store(cfg.checkpoint, cfg.run)
        assert store.list_steps() == list(range(1, ITERATIONS + 1)) and store.list_uncommitted() == []
        for step in store.list_steps():
            store.verify(step)  # every part whole, as its manifest says (step 2's actor part was uploaded again)
        expected = reference(cfg, summary["initial_model"])  # reads the initial model from the S3 server
        got = _final_weights(summary, cfg)
    finally:
        standby.stop()
        moto.stop()
    assert killed == [-9], "the S3 server was not killed inside the upload"
    assert mlflow_outage.seen == ["killed", "started"]
    assert any("tracking is unreachable" in r.getMessage() for r in caplog.records), "MLflow was never down"
    assert any("reachable again" in r.getMessage() for r in caplog.records)

    assert summary["iterations"] == ITERATIONS

    client = MlflowClient(tracking_uri=own_mlflow.url)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    per_iteration = ["timing/iteration_s", "perf/throughput_tps", "timing/checkpoint_s"]
    for key in sorted(run.data.metrics):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert len(steps) == len(set(steps)), f"{key} logged twice at a step: {sorted(steps)}"
        if key in per_iteration:
            assert sorted(steps) == list(range(1, ITERATIONS + 1)), f"{key} misses a step: {sorted(steps)}"
    assert set(per_iteration) <= set(run.data.metrics)
    assert not (Path(cfg.run.output_dir) / cfg.run.name / "metrics_unsent.jsonl").exists()

    assert summary["reward_per_iteration"] == expected["reward_per_iteration"]
    assert all(torch.equal(got[k], expected["weights"][k]) for k in got)


def _wait_exit(proc: subprocess.Popen, timeout_s: float) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def test_sigkill_inside_a_save_and_inside_a_commit(outage_cluster, reference, tiny_overrides,  # noqa: F811
                                                   tiny_config, tmp_path: Path):
    """A run driven by ``dockflow train`` in its own process (joined to the module's cluster), with in-run
    restarts on: the actor worker is SIGKILLed while it saves its part of checkpoint 2 (its bytes in a temporary
    file), the run restarts from checkpoint 1 and redoes iteration 2, then the driver is SIGKILLed inside the
    commit of checkpoint 2 (every part written, the manifest not). Both times checkpoint 1 stays the latest;
    ``--resume`` (here ``train(resume=True)``) ends bit-identical to an uninterrupted run: weights and rewards of
    every iteration. The fault points (``dockflow.storage.fault_points``) hold each process where it is killed."""
    iterations = ITERATIONS
    extra = {"checkpoint__every": 1, "eval__every": 0, "fault_tolerance__restart": True}
    overrides = tiny_overrides("kills", iterations, **extra, ray__address=outage_cluster.address)
    cfg = tiny_config("kills", iterations, **extra)  # the same run, driven from this process to resume it
    store = run_store(cfg.checkpoint, cfg.run)
    outage_cluster.arm("save.2.actor")
    outage_cluster.arm("commit.2")
    log = tmp_path / "driver.log"
    with open(log, "wb") as out:
        driver = subprocess.Popen([sys.executable, "-m", "dockflow.cli", "train", "configs/grpo_arith.yaml", *overrides],
                                  cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=out, stderr=out)
    try:
        actor = outage_cluster.wait_hit("save.2.actor")
        assert actor != driver.pid
        os.kill(actor, signal.SIGKILL)
        assert store.latest() == 1 and 2 not in store.list_steps()
        assert outage_cluster.wait_hit("commit.2") == driver.pid, log.read_text()[-3000:]
        assert {"actor.safetensors", "driver.safetensors", "config.safetensors"} <= set(os.listdir(store.location(2)))
        driver.send_signal(signal.SIGKILL)
        assert _wait_exit(driver, 30) == -signal.SIGKILL
    finally:
        if driver.poll() is None:
            driver.kill()
    assert "restarting the run from checkpoint 1" in log.read_text(), log.read_text()[-3000:]
    assert store.latest() == 1 and store.list_uncommitted() == [2]
    assert not (Path(store.location(2)) / "manifest.json").exists()

    outage_cluster.wait_released()
    resumed = train(cfg, resume=True)
    expected = reference(cfg, resumed["initial_model"])
    assert resumed["resumed_from"] == 1 and resumed["iterations"] == iterations
    assert resumed["reward_per_iteration"] == expected["reward_per_iteration"]
    got = _final_weights(resumed, cfg)
    assert all(torch.equal(got[k], expected["weights"][k]) for k in got), "the resumed run differs"
    assert store.list_uncommitted() == []


def test_full_disk_while_saving_a_checkpoint(outage_cluster, tiny_config):  # noqa: F811
    """The actor's process gets a 1 MiB file-size limit before checkpoint 2 (its part is about 12 MB): its save
    fails with EFBIG, a real write error of the real process. The run stops with one line naming the part's path
    and the reason, and checkpoint 1 is intact (its parts match its manifest); nothing of step 2 is visible."""
    import ray

    cfg = tiny_config("full-disk", 3, checkpoint__every=1, eval__every=0)

    def file_size_limit(worker) -> None:  # in the actor's process: writes past 1 MiB fail with EFBIG
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    def limit_actor(step: int, metrics: dict) -> None:
        if step == 2:  # iteration 2 closed; its checkpoint's save is sent to the actor after this call returns
            actor = ray.get_actor(f"{cfg.run.name}-actor")
            ray.get(actor.__ray_call__.remote(file_size_limit))

    with pytest.raises(StageError) as err:
        train(cfg, on_iteration=limit_actor)
    line = str(err.value)
    store = run_store(cfg.checkpoint, cfg.run)
    part = Path(store.location(2)) / "actor.safetensors"
    assert "\n" not in line and f"cannot write checkpoint part {part}: the file-size limit is reached" in line, line
    assert "(EFBIG)" in line and "checkpoints committed before are intact" in line
    assert store.latest() == 1 and store.verify(1).step == 1
    assert not part.exists() and 2 not in store.list_steps()


CHAMPION_RACER = """
import json, sys, time
import dockflow.tracking.champion as champion
from dockflow.config import RegistryConfig
read = champion._champion
champion._champion = lambda *a: (read(*a), time.sleep(0.3))[0]  # widen the read-then-move window
uri, name, version, score, go = sys.argv[1:]
while not __import__("os").path.exists(go):
    time.sleep(0.01)
d = champion.decide_champion(uri, RegistryConfig(model_name=name, lock_timeout_s=60), int(version), float(score))
print(json.dumps({"moved": d.moved, "previous": d.previous_version, "version": d.version}))
"""


def test_two_runs_race_for_the_champion_through_the_server(mlflow_server: str, tmp_path: Path):
    """Two processes decide the champion at once through ``mlflow server`` (HTTP, the lock's tickets in its
    SQL registry): they take turns, so the better one ends as the champion and no two moves beat the same one."""
    name = f"race-{uuid.uuid4().hex[:8]}"
    cfg = RegistryConfig(model_name=name)
    versions = []
    for i, score in enumerate([0.5, 0.6, 0.7]):
        model = tmp_path / f"model{i}"
        model.mkdir()
        (model / "config.json").write_text('{"model_type": "qwen2"}')
        (model / "model.safetensors").write_bytes(os.urandom(1024))
        with Tracker.start(TrackingConfig(uri=mlflow_server, experiment="race"), tmp_path, f"racer-{i}") as tr:
            versions.append(register_final_model(mlflow_server, cfg, tr.run_id, model, score, tags=SAME))
    assert decide_champion(mlflow_server, cfg, versions[0], 0.5).moved
    go = tmp_path / "go"
    racers = [subprocess.Popen([sys.executable, "-c", CHAMPION_RACER, mlflow_server, name, str(v), str(s), str(go)],
                               cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
              for v, s in zip(versions[1:], [0.6, 0.7], strict=True)]
    try:
        time.sleep(0.5)
        go.touch()
        outs = [r.communicate(timeout=120) for r in racers]
    finally:
        for r in racers:
            if r.poll() is None:
                r.kill()
    assert all(r.returncode == 0 for r in racers), [err[-2000:] for _, err in outs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    moves = [(r["previous"], r["version"]) for r in results if r["moved"]]
    assert len({prev for prev, _ in moves}) == len(moves), f"two runs beat the same champion: {results}"
    client = MlflowClient(tracking_uri=mlflow_server, registry_uri=mlflow_server)
    assert int(client.get_registered_model(name).aliases["champion"]) == versions[2]
    assert client.search_model_versions(f"name='{lock_model_name(cfg)}'") == []  # every ticket released
