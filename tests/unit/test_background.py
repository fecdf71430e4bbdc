"""Light processes in the background (dockflow/background.py): every thread under SCHED_BATCH, threads started
later too, torch kept to one thread; nothing changes outside a Ray actor or with DOCKFLOW_BACKGROUND=0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dockflow.background import run_in_background, thread_ids

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux only")

# In a fresh process (so this test's own process keeps its policy): a thread from before, the call, a thread
# started after it; a stand-in torch module records the thread count it was given.
PROBE = """
import json, os, sys, threading, types
calls = []
sys.modules["torch"] = types.SimpleNamespace(set_num_threads=calls.append)
from dockflow.background import background_policy, thread_ids
stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()
policy = background_policy()
seen = {}
after = threading.Thread(target=lambda: seen.update(after=os.sched_getscheduler(0))); after.start(); after.join()
out = {"policy": policy, "threads": len(thread_ids()), "torch_threads": calls, "after": seen["after"],
       "all": sorted({os.sched_getscheduler(t) for t in thread_ids()})}
stop.set(); before.join()
print(json.dumps(out))
"""


def test_every_thread_and_later_ones_run_under_sched_batch() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["policy"] == "batch"
    assert out["threads"] >= 2  # the main thread and the one started before the call
    assert out["all"] == [os.SCHED_BATCH]
    assert out["after"] == os.SCHED_BATCH  # inherited from the thread that started it
    assert out["torch_threads"] == [1]


def test_outside_a_ray_actor_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    before = {t: os.sched_getscheduler(t) for t in thread_ids()}
    assert run_in_background() == "normal"  # pytest is no Ray actor
    monkeypatch.setattr("dockflow.background.in_ray_actor", lambda: True)
    monkeypatch.setenv("DOCKFLOW_BACKGROUND", "0")
    assert run_in_background() == "normal"  # switched off for an A/B measurement
    after = {t: os.sched_getscheduler(t) for t in before if t in thread_ids()}
    assert after == {t: p for t, p in before.items() if t in after}
