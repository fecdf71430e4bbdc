"""The Ray head goes away mid-run: ``dockflow train`` joined to a head started apart (``ray start --head``) stops
within ``ray.head_timeout_s`` with one line that names the lost head, the latest checkpoint and how to resume
(exit 2), instead of waiting for Ray to kill it after 60 s with its own message; with a new head, the same
command with ``--resume`` continues from that checkpoint and trains every sample once (the lost run is a
``dockflow train`` process of its own, as it exits the process; the resubmitted one runs ``dockflow.cli.main`` in
the test process)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import ray

from dockflow.cli import main
from dockflow.config import load_config
from dockflow.storage import run_store
from dockflow.workers.cluster import head_reachable
from dockflow.workers.resources import build_plan

pytestmark = pytest.mark.slow
CONFIG = "configs/grpo_arith.yaml"
ITERATIONS = 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_head(port: int, tmp: Path) -> subprocess.Popen:
    """A one-node Ray cluster of its own (``ray start --head --block``), in its own session; up when its port
    answers. ``tmp`` is short: Ray's socket paths live under it."""
    ray_bin = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen(
        [ray_bin, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false", "--block",
         "--node-ip-address=127.0.0.1", f"--temp-dir={tmp}"],
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}, start_new_session=True,  # the suite's token
        stdout=open(f"{tmp}.log", "w"), stderr=subprocess.STDOUT,  # noqa: SIM115 - the child holds it
    )
    deadline = time.monotonic() + 120
    while not head_reachable(("127.0.0.1", port)):
        assert head.poll() is None and time.monotonic() < deadline, Path(f"{tmp}.log").read_text()[-2000:]
        time.sleep(0.5)
    return head


def kill_head(head: subprocess.Popen) -> None:
    """SIGKILL the head and everything it started (GCS, raylet, the run's workers): the machine is gone."""
    try:
        procs = [psutil.Process(head.pid), *psutil.Process(head.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    head.wait(timeout=30)


@pytest.fixture
def ray_tmp():
    """Short temp directories for the heads (Unix socket paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="dfhead-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_lost_head_stops_the_run_with_one_line_and_the_resubmitted_run_resumes(tiny_overrides, ray_tmp):
    port = free_port()
    overrides = tiny_overrides("headloss", ITERATIONS, dock__backend="centralized", eval__every=ITERATIONS,
                               eval__num_prompts=4, sft__enabled=False, ray__address=f"127.0.0.1:{port}",
                               ray__head_timeout_s=5)  # a fresh tiny model: no SFT
    cfg = load_config(CONFIG, overrides)
    store = run_store(cfg.checkpoint, cfg.run)
    cmd = [sys.executable, "-m", "dockflow.cli", "train", CONFIG, *overrides]
    head = start_head(port, ray_tmp / "1")
    try:
        run = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while (store.latest() or 0) < 2:
            assert run.poll() is None, run.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.1)
        killed = time.monotonic()
        kill_head(head)
        _, err = run.communicate(timeout=120)
        detected_s = time.monotonic() - killed
    finally:
        kill_head(head)
    latest = store.latest()
    print(f"head killed after checkpoint {latest}: dockflow train exited {run.returncode} after {detected_s:.1f}s")
    last = err.strip().splitlines()[-1]
    assert run.returncode == 2, err[-3000:]
    assert last.startswith("dockflow train: error: lost the Ray head at 127.0.0.1:"), err[-3000:]
    assert f"its latest checkpoint is iteration {latest}" in last and "--resume" in last
    assert "Traceback" not in err
    assert detected_s < 5 + 20, detected_s  # ray.head_timeout_s, and the exit

    assert not ray.is_initialized()  # so the resubmitted command joins the new head, as its own process would
    head = start_head(port, ray_tmp / "2")
    try:  # the same command, resubmitted: in this process (``dockflow.cli.main``), which then joins the new head
        assert main(["train", CONFIG, *overrides, "--resume"]) == 0
    finally:
        kill_head(head)
    assert not ray.is_initialized()
    summary = json.loads((Path(cfg.run.output_dir) / cfg.run.name / "summary.json").read_text())
    assert summary["resumed_from"] == latest and summary["iterations"] == ITERATIONS
    assert summary["samples_trained"] == ITERATIONS * build_plan(cfg).train_batch, "an iteration was counted twice or lost"
