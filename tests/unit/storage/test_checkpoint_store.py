"""The checkpoint-store interface on both backends (``make_store``: local directory, S3): round trip,
interrupted commits, corruption, retention (last K, best); local-only: paths, multi-process writers."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
import torch
from fixtures.ranks import CONTEXT

from dockflow.config import CheckpointConfig
from dockflow.storage import CheckpointError, CheckpointStore, LocalCheckpointStore, open_store


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(16, 8, generator=g), "b": torch.randn(8, generator=g)}


def _save(store: CheckpointStore, step: int, **meta: float | None) -> None:
    store.write_part(step, "actor", _state(step))
    store.commit(step, {"iteration": step, **meta})


def test_round_trip(make_store) -> None:
    store = make_store(keep=3)
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
    assert sorted(store._list_files(10)) == ["actor.safetensors", "actor.safetensors.json", "manifest.json",
                                             "rng.safetensors", "rng.safetensors.json"]
    if isinstance(store, LocalCheckpointStore):
        assert sorted(p.name for p in (store.root / "step-000010").iterdir()) == sorted(store._list_files(10))


def test_interrupted_before_commit_is_ignored(make_store, caplog: pytest.LogCaptureFixture) -> None:
    store = make_store(keep=3)
    _save(store, 5)
    store.write_part(10, "actor", _state(10))  # the run dies here, before commit
    with caplog.at_level(logging.WARNING, logger="dockflow.storage"):
        assert store.latest() == 5
    assert "step-000010" in caplog.text and "no manifest" in caplog.text
    with pytest.raises(CheckpointError, match="not committed"):
        store.read_part(10, "actor")
    assert store.list_uncommitted() == [10]
    # The resumed run commits a later step: the stale uncommitted step 10 is cleaned up... once older than it.
    _save(store, 15)
    assert store.list_uncommitted() == [] and store._list_files(10) == {}
    assert store.list_steps() == [5, 15]


def test_corrupted_part_is_detected(make_store, raw, caplog: pytest.LogCaptureFixture) -> None:
    store = make_store(keep=3)
    _save(store, 1)
    _save(store, 2)
    data = bytearray(raw.get(store, 2, "actor.safetensors"))
    data[len(data) // 2] ^= 0xFF  # same size, different bytes
    raw.put(store, 2, "actor.safetensors", bytes(data))
    with pytest.raises(CheckpointError, match=r"step-000002/actor\.safetensors is corrupt"):
        store.read_part(2, "actor")
    with caplog.at_level(logging.WARNING, logger="dockflow.storage"):
        assert store.latest() == 1
    assert "corrupt" in caplog.text
    raw.put(store, 2, "actor.safetensors", b"short")  # truncated
    with pytest.raises(CheckpointError, match="size 5"):
        store.verify(2)
    raw.delete(store, 2, "actor.safetensors")
    with pytest.raises(CheckpointError, match=r"step-000002/actor\.safetensors is missing"):
        store.read_part(2, "actor")
    assert store.latest() == 1


def test_missing_part_errors(make_store, raw) -> None:
    store = make_store(keep=2)
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
    raw.delete(store, 8, "actor.safetensors.json")  # the writer died before its record
    with pytest.raises(CheckpointError, match=r"parts \['actor'\] have no record"):
        store.commit(8, {})
    store.write_part(9, "actor", {})
    raw.put(store, 9, "actor.safetensors", b"cut")  # the part changed after its record was written
    with pytest.raises(CheckpointError, match=r"step-000009/actor\.safetensors is 3 bytes but its record says"):
        store.commit(9, {})
    with pytest.raises(CheckpointError, match="invalid checkpoint part name"):
        store.write_part(6, "../evil", {})


def test_retention_keeps_last_k(make_store) -> None:
    store = make_store(keep=2)
    for step in (1, 2, 3, 4):
        _save(store, step)
    assert store.list_steps() == [3, 4]
    assert store.list_uncommitted() == [] and store._list_files(1) == {} and store._list_files(2) == {}
    # A commit of an older step never deletes the checkpoint it just wrote.
    _save(store, 2)
    assert store.list_steps() == [2, 3, 4]
    _save(store, 5)
    assert store.list_steps() == [4, 5]


@pytest.mark.parametrize("mode", ["max", "min"])
def test_retention_keeps_the_best(make_store, mode: str) -> None:
    store = make_store(keep=2, best_metric="accuracy", best_mode=mode)
    scores = {1: 0.2, 2: 0.9, 3: None, 4: 0.5, 5: 0.1, 6: 0.4}  # None: no evaluation before that checkpoint
    for step, acc in scores.items():
        _save(store, step, accuracy=acc)
    best = 2 if mode == "max" else 5
    assert store.list_steps() == sorted({5, 6, best})
    assert store.best_step() == best
    _save(store, 7, accuracy=0.9 if mode == "max" else 0.1)  # a tie goes to the newer step
    assert store.list_steps() == [6, 7]
    assert store.read_part(7, "actor")["w"].shape == (16, 8)


def test_retention_best_metric_missing_warns(make_store, caplog: pytest.LogCaptureFixture) -> None:
    store = make_store(keep=1, best_metric="acuracy")  # a typo: no checkpoint has it
    with caplog.at_level(logging.WARNING, logger="dockflow.storage"):
        for step in (1, 2):
            _save(store, step, accuracy=step / 10)
    assert store.list_steps() == [2]
    assert "'acuracy' is not a number in the meta of any committed checkpoint" in caplog.text
    assert "['accuracy', 'iteration']" in caplog.text


def test_best_metric_config_is_checked() -> None:
    with pytest.raises(ValueError, match="keep_best is true but checkpoint.best_metric is not set"):
        CheckpointConfig(keep_best=True)
    with pytest.raises(CheckpointError, match="best_mode must be 'max' or 'min'"):
        LocalCheckpointStore("unused", keep=1, best_metric="x", best_mode="median")  # type: ignore[arg-type]


def _write_from_child(root: str, step: int, name: str, seed: int) -> None:
    LocalCheckpointStore(root, keep=2).write_part(step, name, _state(seed))


def test_parts_from_two_processes(tmp_path: Path) -> None:
    ctx = CONTEXT
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
    with pytest.raises(CheckpointError, match=r"'gs://' backend is not available; use a local directory path or s3://"):
        open_store(CheckpointConfig(dir="gs://bucket/run"), tmp_path)
    kept = open_store(CheckpointConfig(keep=1, keep_best=True, best_metric="accuracy", best_mode="min"), tmp_path)
    assert (kept.keep, kept.best_metric, kept.best_mode) == (1, "accuracy", "min")
    assert open_store(CheckpointConfig(best_metric="accuracy"), tmp_path).best_metric is None  # keep_best false


def test_run_store_puts_each_run_under_its_name(tmp_path: Path, s3_checkpoint_dir: str) -> None:
    from dockflow.config import load_config
    from dockflow.storage import S3CheckpointStore, run_store

    def store(*overrides: str) -> CheckpointStore:
        cfg = load_config(None, list(overrides))
        return run_store(cfg.checkpoint, cfg.run)

    default = store(f"run.output_dir={tmp_path}", "run.name=a")
    assert isinstance(default, LocalCheckpointStore) and default.location() == str(tmp_path / "a" / "checkpoints")
    local = store(f"checkpoint.dir={tmp_path}/ckpt/", "run.name=b")
    assert local.location() == str(tmp_path / "ckpt" / "b")
    remote = store(f"checkpoint.dir={s3_checkpoint_dir}/", "run.name=c")
    assert isinstance(remote, S3CheckpointStore) and remote.location() == f"{s3_checkpoint_dir}/c"
    with pytest.raises(CheckpointError, match="run.name 'x/y' cannot name a checkpoint folder"):
        store(f"checkpoint.dir={tmp_path}", "run.name=x/y")
