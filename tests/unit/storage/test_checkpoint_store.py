"""LocalCheckpointStore: round trip, interrupted commits, corruption, retention, multi-process writers."""

from __future__ import annotations

import logging
import multiprocessing as mp
import random
from pathlib import Path

import pytest
import torch

from dockflow.config import CheckpointConfig
from dockflow.storage import CheckpointError, LocalCheckpointStore, open_store


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(16, 8, generator=g), "b": torch.randn(8, generator=g)}


def _save(store: LocalCheckpointStore, step: int) -> None:
    store.write_part(step, "actor", _state(step))
    store.commit(step, {"iteration": step})


def test_round_trip(tmp_path: Path) -> None:
    store = LocalCheckpointStore(tmp_path / "ckpt", keep=3)
    assert store.latest() is None
    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    store.write_part(10, "actor", _state(1))
    store.write_part(10, "rng", rng)
    manifest = store.commit(10, {"iteration": 10, "policy_version": 3})
    assert sorted(manifest.parts) == ["actor", "rng"]
    assert store.latest() == 10
    assert store.list_steps() == [10]
    assert store.list_parts(10) == ["actor", "rng"]
    assert store.read_meta(10) == {"iteration": 10, "policy_version": 3}
    loaded = store.read_part(10, "actor")
    assert all(torch.equal(loaded[k], v) for k, v in _state(1).items())
    got_rng = store.read_part(10, "rng")
    assert torch.equal(got_rng["torch"], rng["torch"])
    assert got_rng["python"] == rng["python"]
    # Nothing temporary is left behind.
    assert not [p for p in (tmp_path / "ckpt" / "step-000010").iterdir() if p.name.startswith(".")]


def test_interrupted_before_commit_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = LocalCheckpointStore(tmp_path, keep=3)
    _save(store, 5)
    store.write_part(10, "actor", _state(10))  # the run dies here, before commit
    with caplog.at_level(logging.WARNING, logger="dockflow.storage"):
        assert store.latest() == 5
    assert "step-000010" in caplog.text and "no manifest" in caplog.text
    with pytest.raises(CheckpointError, match="not committed"):
        store.read_part(10, "actor")
    # The resumed run commits a later step: the stale uncommitted step 10 is cleaned up... once older than it.
    _save(store, 15)
    assert not (tmp_path / "step-000010").exists()
    assert store.list_steps() == [5, 15]


def test_corrupted_part_is_detected(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = LocalCheckpointStore(tmp_path, keep=3)
    _save(store, 1)
    _save(store, 2)
    part = tmp_path / "step-000002" / "actor.pt"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different bytes
    part.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"step-000002/actor\.pt is corrupt"):
        store.read_part(2, "actor")
    with caplog.at_level(logging.WARNING, logger="dockflow.storage"):
        assert store.latest() == 1
    assert "corrupt" in caplog.text
    part.write_bytes(b"short")
    with pytest.raises(CheckpointError, match="size 5"):
        store.verify(2)


def test_missing_part_errors(tmp_path: Path) -> None:
    store = LocalCheckpointStore(tmp_path, keep=2)
    store.write_part(3, "actor", _state(3))
    with pytest.raises(CheckpointError, match=r"parts \['critic'\] were not written"):
        store.commit(3, {}, parts=["actor", "critic"])
    assert store.list_steps() == []
    store.commit(3, {}, parts=["actor"])
    with pytest.raises(CheckpointError, match="no part 'critic'"):
        store.read_part(3, "critic")
    with pytest.raises(CheckpointError, match="already committed"):
        store.write_part(3, "actor", _state(3))
    with pytest.raises(CheckpointError, match="no parts were written"):
        store.commit(4, {})
    store.write_part(5, "actor", {})
    with pytest.raises(CheckpointError, match="meta key 't' is not JSON-serializable"):
        store.commit(5, {"t": torch.zeros(1)})
    store.write_part(8, "actor", {})
    (tmp_path / "step-000008" / "actor.pt.json").unlink()  # the writer died before its record
    with pytest.raises(CheckpointError, match=r"parts \['actor'\] have no record"):
        store.commit(8, {})
    with pytest.raises(CheckpointError, match="invalid checkpoint part name"):
        store.write_part(6, "../evil", {})


def test_retention_keeps_last_k(tmp_path: Path) -> None:
    store = LocalCheckpointStore(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        _save(store, step)
    assert store.list_steps() == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000003", "step-000004"]
    # A commit of an older step never deletes the checkpoint it just wrote.
    _save(store, 2)
    assert store.list_steps() == [2, 3, 4]
    _save(store, 5)
    assert store.list_steps() == [4, 5]


def _write_from_child(root: str, step: int, name: str, seed: int) -> None:
    LocalCheckpointStore(root, keep=2).write_part(step, name, _state(seed))


def test_parts_from_two_processes(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_write_from_child, args=(str(tmp_path), 7, f"actor.rank{r}", r)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
        assert p.exitcode == 0, f"writer process {p.pid} ended with {p.exitcode} (None: hung for 60 s)"
    store = LocalCheckpointStore(tmp_path, keep=2)
    store.commit(7, {"iteration": 7}, parts=["actor.rank0", "actor.rank1"])
    assert store.latest() == 7
    for r in (0, 1):
        got = store.read_part(7, f"actor.rank{r}")
        assert torch.equal(got["w"], _state(r)["w"])


def test_open_store_paths_and_errors(tmp_path: Path) -> None:
    store = open_store(CheckpointConfig(keep=3), tmp_path / "run")
    assert isinstance(store, LocalCheckpointStore)
    assert store.root == tmp_path / "run" / "checkpoints" and store.keep == 3
    assert store.location() == str(tmp_path / "run" / "checkpoints")
    assert store.location(7).endswith("checkpoints/step-000007")
    assert open_store(CheckpointConfig(dir=str(tmp_path / "elsewhere")), tmp_path).root == tmp_path / "elsewhere"
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match=r"a_file/ckpt.*set checkpoint.dir to a writable directory"):
        open_store(CheckpointConfig(dir=str(blocker / "ckpt")), tmp_path)
    with pytest.raises(CheckpointError, match="'s3://' backend is not available"):
        open_store(CheckpointConfig(dir="s3://bucket/run"), tmp_path)
