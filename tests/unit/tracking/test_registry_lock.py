"""The champion lock against a real SQLite store: waiting, heartbeats, timeouts, stale tickets, release on
error, and concurrent decisions from threads and from two processes."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures.mlflow_store import IDENTITY, Store
from mlflow.tracking import MlflowClient

from dockflow.config import RegistryConfig
from dockflow.tracking.champion import ChampionDecision, decide_champion
from dockflow.tracking.registry import (
    RegistryError,
    RegistryLockTimeout,
    lock_model_name,
    register_final_model,
)
from dockflow.tracking.registry_lock import OWNER_TAG, TICKET_SOURCE, RegistryLock

REPO = Path(__file__).resolve().parents[3]


def _register(store: Store, cfg: RegistryConfig, hf_dir: Callable[[int], Path], seed: int, score: float) -> int:
    return register_final_model(store.uri, cfg, store.new_run(f"v{seed}"), hf_dir(seed), score, tags=IDENTITY)


def _champion(store: Store, name: str) -> int:
    return int(store.client().get_registered_model(name).aliases["champion"])


def _assert_serialized(decisions: list[ChampionDecision], old: int, best: int) -> None:
    """The moves form one chain old -> ... -> best: no two decisions won against the same champion."""
    moves = {d.previous_version: d.version for d in decisions if d.moved}
    assert len(moves) == sum(d.moved for d in decisions), f"two runs beat the same champion: {decisions}"
    at = old
    while at in moves:
        at = moves.pop(at)
    assert at == best and not moves, decisions


def test_waiter_queues_behind_a_holder_that_keeps_its_lease(store: Store, model_name: str) -> None:
    client, name = store.client(), f"{model_name}.lock"
    # a stale age of 2 s: a loaded machine (the suite beside other work) can stall the heartbeat thread for ~1 s
    holder = RegistryLock(client, name, owner="holder", timeout_s=5, stale_after_s=2.0, poll_s=0.05)
    holder.acquire()
    got: list[float] = []

    def wait() -> None:
        with RegistryLock(client, name, owner="waiter", timeout_s=15, stale_after_s=2.0, poll_s=0.05):
            got.append(time.monotonic())

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(4.2)  # twice the stale age: the holder's heartbeat keeps it
    assert not got
    holder.check_held()
    released = time.monotonic()
    holder.release()
    thread.join(timeout=10)
    assert got and got[0] >= released
    assert holder.live_tickets() == []


def test_timeout_names_the_holder_and_leaves_no_ticket(
    store: Store, hf_dir: Callable[[int], Path], model_name: str
) -> None:
    # the waiter's stale age is its lock_timeout_s: 2.5 s, so a loaded machine's late heartbeat is not taken for
    # a dead holder (at 1 s it was, once, in a full suite on 2 cores)
    cfg = RegistryConfig(model_name=model_name, lock_timeout_s=2.5)
    version = _register(store, cfg, hf_dir, 1, 0.5)
    holder = RegistryLock(  # heartbeats every 0.05 s, well inside the waiter's stale age
        store.client(), lock_model_name(cfg), owner="nightly-42", timeout_s=5, stale_after_s=0.2, poll_s=0.05
    )
    ticket = holder.acquire()
    try:
        t0 = time.monotonic()
        with pytest.raises(RegistryLockTimeout) as info:
            decide_champion(store.uri, cfg, version, 0.5)
        assert time.monotonic() - t0 < 5
        msg = str(info.value)
        assert f"ticket {ticket.number} is held by nightly-42" in msg and store.uri in msg
        assert "registry.lock_timeout_s" in msg and "\n" not in msg
        assert store.live_tickets(cfg) == [ticket.number]  # the waiter removed its own ticket
    finally:
        holder.release()
    assert store.live_tickets(cfg) == []
    assert "champion" not in store.client().get_registered_model(model_name).aliases


def test_stale_ticket_of_a_dead_run_is_broken(
    store: Store, hf_dir: Callable[[int], Path], model_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = RegistryConfig(model_name=model_name, lock_timeout_s=0.6)
    version = _register(store, cfg, hf_dir, 1, 0.5)
    client, lock = store.client(), lock_model_name(cfg)
    client.create_registered_model(lock)
    dead = client.create_model_version(lock, TICKET_SOURCE, tags={OWNER_TAG: "dead-run"})  # no heartbeat ever
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="dockflow.tracking.registry_lock"):
        decision = decide_champion(store.uri, cfg, version, 0.5)
    assert decision.moved and _champion(store, model_name) == version
    assert 0.5 <= time.monotonic() - t0 < 10
    assert f"breaking stale lock ticket {dead.version}" in caplog.text and "dead-run" in caplog.text
    assert store.live_tickets(cfg) == []


def test_broken_holder_does_not_write(store: Store, model_name: str) -> None:
    client, name = store.client(), f"{model_name}.lock"
    stalled = RegistryLock(client, name, owner="stalled", timeout_s=5, stale_after_s=60)
    stalled.acquire()
    assert stalled.ticket is not None
    client.delete_model_version(name, str(stalled.ticket.number))  # what a waiter does to a stale ticket
    with pytest.raises(RegistryError, match="was broken by another process"):
        stalled.check_held()
    stalled.release()  # already gone: no error


def test_lock_is_released_when_the_decision_raises(
    store: Store, hf_dir: Callable[[int], Path], model_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = RegistryConfig(model_name=model_name)
    version = _register(store, cfg, hf_dir, 1, 0.5)

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("alias write failed")

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", boom)
    with pytest.raises(RegistryError, match="alias write failed"):
        decide_champion(store.uri, cfg, version, 0.5)
    assert store.live_tickets(cfg) == []
    monkeypatch.undo()
    assert decide_champion(store.uri, cfg, version, 0.5).moved  # nothing left blocks the next decision


def test_concurrent_threads_serialize_against_one_old_champion(
    store: Store, hf_dir: Callable[[int], Path], model_name: str
) -> None:
    cfg = RegistryConfig(model_name=model_name, champion_margin=0.01, lock_timeout_s=30)
    old = _register(store, cfg, hf_dir, 0, 0.5)
    assert decide_champion(store.uri, cfg, old, 0.5).moved
    scores = [0.45, 0.7, 0.505, 0.8, 0.6, 0.75]
    versions = [_register(store, cfg, hf_dir, i + 1, s) for i, s in enumerate(scores)]
    barrier = threading.Barrier(len(scores))
    decisions: list[ChampionDecision] = []
    errors: list[BaseException] = []

    def run(version: int, score: float) -> None:
        try:
            barrier.wait(timeout=10)
            decisions.append(decide_champion(store.uri, cfg, version, score))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=vs) for vs in zip(versions, scores, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    best = versions[scores.index(0.8)]
    assert _champion(store, model_name) == best
    _assert_serialized(decisions, old, best)
    for d in decisions:  # each compared against the champion its turn saw, not a stale read
        assert d.moved == (d.score > d.previous_score + 0.01)
    assert store.live_tickets(cfg) == []


_CHILD = """
import json, sys, time
from pathlib import Path
from dockflow.config import RegistryConfig
import dockflow.tracking.champion as champion
from dockflow.tracking.champion import decide_champion
read = champion._champion
champion._champion = lambda *a: (read(*a), time.sleep(0.3))[0]  # widen the read-then-move window
uri, name, version, score, ready, go = sys.argv[1:]
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.01)
d = decide_champion(uri, RegistryConfig(model_name=name, lock_timeout_s=30), int(version), float(score))
print(json.dumps({"moved": d.moved, "previous_version": d.previous_version, "version": d.version}))
"""


def test_two_processes_serialize_against_one_old_champion(
    store: Store, hf_dir: Callable[[int], Path], model_name: str, tmp_path: Path
) -> None:
    cfg = RegistryConfig(model_name=model_name)
    old = _register(store, cfg, hf_dir, 0, 0.5)
    assert decide_champion(store.uri, cfg, old, 0.5).moved
    scores = [0.6, 0.7]
    versions = [_register(store, cfg, hf_dir, i + 1, s) for i, s in enumerate(scores)]
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, store.uri, model_name, str(v), str(s), str(tmp_path / f"ready{v}"), str(go)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
        )
        for v, s in zip(versions, scores, strict=True)
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready{v}").exists() for v in versions) and time.monotonic() < deadline:
            time.sleep(0.05)
        go.touch()
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    moves = {r["previous_version"]: r["version"] for r in results if r["moved"]}
    assert len(moves) == sum(r["moved"] for r in results), results  # never both against the old champion
    assert _champion(store, model_name) == versions[1]
    assert store.live_tickets(cfg) == []
