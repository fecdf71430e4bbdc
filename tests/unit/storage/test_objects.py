"""Staged models and input files against a real S3-protocol server (moto on loopback): stage then fetch round
trips, idempotent staging, byte checks (manifest sha256, size + ETag MD5 without one), the per-node cache under
concurrency and crashes, and the one-line errors."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import io
import threading
import time
from pathlib import Path

import pytest

from dockflow.config import CheckpointConfig
from dockflow.storage import (
    CheckpointError,
    fetch_file,
    fetch_model,
    file_fingerprint,
    is_s3_uri,
    model_fingerprint,
    stage_model,
    staged_model_exists,
)
from dockflow.storage.dir_manifest import DIR_MANIFEST, read_dir_manifest
from dockflow.storage.s3_bucket import S3Bucket
from dockflow.storage.s3_client import S3Options

CKPT = CheckpointConfig()  # endpoint and keys from the environment (s3_env)
FILES = {"config.json": b'{"a": 1}', "model.safetensors": bytes(range(256)) * 40, "sub/dir/notes.txt": b"hi\n"}


def _model_dir(root: Path, files: dict[str, bytes] = FILES) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _bucket() -> S3Bucket:
    return S3Bucket("dockflow-test", S3Options.from_config(CKPT))


def _put(url: str, data: bytes, **kw: object) -> None:
    key = url.removeprefix("s3://dockflow-test/")
    _bucket().client.put_object("dockflow-test", key, io.BytesIO(data), len(data), **kw)


def _count(monkeypatch: pytest.MonkeyPatch, name: str) -> list[str]:
    """Record the keys passed to ``S3Bucket.<name>`` (still calling it)."""
    keys: list[str] = []
    real = getattr(S3Bucket, name)

    def spy(self: S3Bucket, key: str, *args: object, **kwargs: object) -> object:
        keys.append(key)
        return real(self, key, *args, **kwargs)

    monkeypatch.setattr(S3Bucket, name, spy)
    return keys


def test_stage_then_fetch_a_tiny_model(s3_checkpoint_dir: str, tmp_path: Path) -> None:
    from dockflow.config import TinyModelConfig
    from dockflow.models import (
        build_char_tokenizer,
        build_tiny_model,
        load_model_and_tokenizer,
        save_pretrained_dir,
    )

    micro_cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    tok = build_char_tokenizer()
    src = save_pretrained_dir(build_tiny_model(micro_cfg, tok, seed=0), tok, tmp_path / "src")
    (src / "extra" / "deep").mkdir(parents=True)
    (src / "extra" / "deep" / "notes.txt").write_text("nested\n")
    dest = f"{s3_checkpoint_dir}/initial_model/"
    assert is_s3_uri(dest) and not is_s3_uri(str(src)) and not staged_model_exists(dest, CKPT)
    uri = stage_model(src, dest, CKPT)
    assert uri == f"{s3_checkpoint_dir}/initial_model" and staged_model_exists(uri, CKPT)
    local = fetch_model(uri, CKPT, cache_dir=tmp_path / "cache")
    assert local.parent == tmp_path / "cache" / "models" and local.name.startswith("initial_model-")
    got = _tree(local)
    assert got.pop(DIR_MANIFEST) and got == _tree(src)
    model, _ = load_model_and_tokenizer(local)
    assert model.config.hidden_size == micro_cfg.hidden_size


def test_staging_twice_uploads_nothing(s3_checkpoint_dir: str, tmp_path: Path, monkeypatch) -> None:
    src, dest = _model_dir(tmp_path / "m"), f"{s3_checkpoint_dir}/model"
    uploads, puts = _count(monkeypatch, "upload_file"), _count(monkeypatch, "put_bytes")
    stage_model(src, dest, CKPT)
    assert sorted(k.rsplit("/model/", 1)[1] for k in uploads) == sorted(FILES)
    assert [k.rsplit("/", 1)[1] for k in puts] == [DIR_MANIFEST]  # the manifest is written last, once
    uploads.clear(), puts.clear()
    assert stage_model(src, dest, CKPT) == dest and uploads == [] and puts == []
    # A changed file: the old manifest goes first, only that file is uploaded again, then the new manifest.
    (src / "config.json").write_bytes(b'{"a": 2}')
    stage_model(src, dest, CKPT)
    assert [k.rsplit("/", 1)[1] for k in uploads] == ["config.json"] and len(puts) == 1
    assert fetch_model(dest, CKPT, tmp_path / "cache").joinpath("config.json").read_bytes() == b'{"a": 2}'


def test_corrupt_object_is_refused_and_leaves_nothing(s3_checkpoint_dir: str, tmp_path: Path) -> None:
    dest = stage_model(_model_dir(tmp_path / "m"), f"{s3_checkpoint_dir}/model", CKPT)
    _put(f"{dest}/model.safetensors", b"x" * len(FILES["model.safetensors"]))  # same size, other bytes
    with pytest.raises(CheckpointError) as err:
        fetch_model(dest, CKPT, tmp_path / "cache")
    msg = str(err.value)
    assert msg.startswith(f"{dest}/model.safetensors is corrupt: 10240 bytes with sha256 ") and "\n" not in msg
    assert msg.endswith("stage the model again")
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir() if not p.name.endswith(".lock")] == []


def test_user_upload_without_manifest(s3_checkpoint_dir: str, tmp_path: Path, monkeypatch) -> None:
    uri = f"{s3_checkpoint_dir}/user-model"
    for rel, data in FILES.items():
        _put(f"{uri}/{rel}", data)
    _put(f"{uri}/.cache/huggingface/x.lock", b"")  # hidden: not part of the model
    local = fetch_model(uri, CKPT, tmp_path / "cache")
    got = _tree(local)
    recorded = read_dir_manifest(local)
    assert got.pop(DIR_MANIFEST) and got == FILES and recorded is not None
    assert recorded.files["config.json"].sha256 == hashlib.sha256(FILES["config.json"]).hexdigest()
    assert model_fingerprint(uri, CKPT).startswith("etags:")
    # The cached copy is reused (sizes checked against its recorded manifest): only the manifest is asked for.
    downloads = _count(monkeypatch, "download")
    assert fetch_model(uri, CKPT, tmp_path / "cache") == local
    assert [k.rsplit("/", 1)[1] for k in downloads] == [DIR_MANIFEST]
    # Bytes whose MD5 differs from the ETag (single-part upload: ETag = MD5) are refused.
    real = S3Bucket.download

    def garbled(self: S3Bucket, key: str, sink: object, md5: bool = False) -> object:
        got = real(self, key, sink, md5)
        return dataclasses.replace(got, md5="0" * 32) if key.endswith("notes.txt") else got

    monkeypatch.setattr(S3Bucket, "download", garbled)
    with pytest.raises(CheckpointError, match=r"/user-model/sub/dir/notes\.txt is corrupt: the MD5 of its 3 bytes"):
        fetch_model(uri, CKPT, tmp_path / "other-cache")


def test_two_threads_fetch_one_copy(s3_checkpoint_dir: str, tmp_path: Path, monkeypatch) -> None:
    dest = stage_model(_model_dir(tmp_path / "m"), f"{s3_checkpoint_dir}/model", CKPT)
    downloads = _count(monkeypatch, "download")
    barrier, results, errors = threading.Barrier(2), [], []

    def fetch() -> None:
        barrier.wait()
        try:
            results.append(fetch_model(dest, CKPT, tmp_path / "cache"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and len(results) == 2 and results[0] == results[1]
    assert _tree(results[0]).keys() == {*FILES, DIR_MANIFEST}
    # One thread downloaded the files, the other waited and reused its copy (both read the manifest).
    assert sorted(k.rsplit("/model/", 1)[1] for k in downloads) == sorted([*FILES, DIR_MANIFEST, DIR_MANIFEST])


def test_interrupted_fetch_leaves_no_half_copy(s3_checkpoint_dir: str, tmp_path: Path, monkeypatch) -> None:
    dest = stage_model(_model_dir(tmp_path / "m"), f"{s3_checkpoint_dir}/model", CKPT)
    real = S3Bucket.download

    def dying(self: S3Bucket, key: str, sink: object, md5: bool = False) -> object:
        if key.endswith("notes.txt"):
            raise CheckpointError("simulated crash")
        return real(self, key, sink, md5)

    with monkeypatch.context() as patch:
        patch.setattr(S3Bucket, "download", dying)
        with pytest.raises(CheckpointError, match="simulated crash"):
            fetch_model(dest, CKPT, tmp_path / "cache")
    models = tmp_path / "cache" / "models"
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == []
    assert _tree(fetch_model(dest, CKPT, tmp_path / "cache")).keys() == {*FILES, DIR_MANIFEST}


def test_fetch_file_checks_and_caches(s3_checkpoint_dir: str, tmp_path: Path, monkeypatch) -> None:
    plain, with_sha = f"{s3_checkpoint_dir}/data/train.jsonl", f"{s3_checkpoint_dir}/data/test.jsonl"
    rows = b'{"prompt": "1+1?", "answer": 2}\n'
    _put(plain, rows)
    _put(with_sha, rows, metadata={"sha256": hashlib.sha256(rows).hexdigest()})
    path = fetch_file(plain, CKPT, tmp_path / "cache")
    assert path.name == "train.jsonl" and path.read_bytes() == rows
    assert file_fingerprint(plain, CKPT) == f"etag:{hashlib.md5(rows).hexdigest()}:{len(rows)}"
    assert file_fingerprint(with_sha, CKPT) == f"sha256:{hashlib.sha256(rows).hexdigest()}"
    assert fetch_file(with_sha, CKPT, tmp_path / "cache").read_bytes() == rows
    downloads = _count(monkeypatch, "download")
    assert fetch_file(plain, CKPT, tmp_path / "cache") == path and downloads == []
    _put(plain, rows + rows)  # new content: a new cache entry
    assert fetch_file(plain, CKPT, tmp_path / "cache").read_bytes() == rows + rows
    _put(with_sha, rows, metadata={"sha256": "0" * 64})
    with pytest.raises(CheckpointError, match=r"test\.jsonl is corrupt: its sha256 differs from the one in its metadata"):
        fetch_file(with_sha, CKPT, tmp_path / "cache")
    assert fetch_file(tmp_path / "x.jsonl", CKPT) == tmp_path / "x.jsonl"  # local paths as they are


def test_local_directories(tmp_path: Path) -> None:
    src = _model_dir(tmp_path / "m")
    assert fetch_model(src, CKPT) == src  # no manifest: as it is
    dest = Path(stage_model(src, tmp_path / "staged", CKPT))
    assert staged_model_exists(dest, CKPT) and _tree(dest).keys() == {*FILES, DIR_MANIFEST}
    mtime = (dest / "model.safetensors").stat().st_mtime_ns
    time.sleep(0.01)
    stage_model(src, dest, CKPT)
    assert (dest / "model.safetensors").stat().st_mtime_ns == mtime  # nothing written the second time
    assert fetch_model(str(dest), CKPT) == dest
    (dest / "model.safetensors").write_bytes(b"short")
    with pytest.raises(CheckpointError, match=r"does not match its dockflow-manifest\.json: model\.safetensors is 5 bytes"):
        fetch_model(dest, CKPT)
    with pytest.raises(CheckpointError, match=r"model directory '.*nope' does not exist: set model\.path"):
        fetch_model(tmp_path / "nope", CKPT)


def _one_line(exc: pytest.ExceptionInfo[CheckpointError]) -> str:
    assert "\n" not in str(exc.value)
    return str(exc.value)


def test_missing_things_and_bad_credentials(s3_checkpoint_dir: str, s3_env, tmp_path: Path, monkeypatch) -> None:
    missing = f"{s3_checkpoint_dir}/nothing-here"
    with pytest.raises(CheckpointError) as err:
        fetch_model(missing, CKPT, tmp_path)
    assert _one_line(err).startswith(f"no model at {missing}: nothing under that prefix at {s3_env.endpoint}: ")
    with pytest.raises(CheckpointError) as err:
        fetch_file(f"{missing}/train.jsonl", CKPT, tmp_path)
    assert _one_line(err).startswith(f"no object {missing}/train.jsonl at {s3_env.endpoint}: check the URI (data.")
    with pytest.raises(CheckpointError) as err:
        fetch_model("s3://no-such-bucket-here/m", CKPT, tmp_path)
    assert _one_line(err).startswith("S3 bucket 'no-such-bucket-here' does not exist at ")
    assert "check the bucket of s3://no-such-bucket-here/m" in str(err.value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-123")
    for fetch in (fetch_model, fetch_file):
        with pytest.raises(CheckpointError) as err:
            fetch(f"{s3_checkpoint_dir}/x.jsonl", CKPT, tmp_path)
        msg = _one_line(err)
        assert f"s3://dockflow-test/{s3_checkpoint_dir.rsplit('/', 1)[1]}/x.jsonl" in msg
        assert "rejected the credentials from env AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (SignatureDoesNotMatch)" in msg
        assert "not-the-secret-123" not in msg
    down = CheckpointConfig(s3_endpoint="http://127.0.0.1:1", s3_attempts=2, s3_backoff_s=0.01)
    with pytest.raises(CheckpointError) as err:
        fetch_model("s3://bucket/m", down, tmp_path)
    assert _one_line(err).startswith("S3 download s3://bucket/m/dockflow-manifest.json at http://127.0.0.1:1 failed after 2 tries")


def test_cache_without_locks_keeps_entries_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dockflow import file_lock
    from dockflow.storage import cache

    def no_locks(*_args: object) -> None:
        raise OSError(errno.ENOLCK, "No locks available")  # what flock says on a file system without locks

    monkeypatch.setattr(file_lock.fcntl, "flock", no_locks)
    first_building, second_building, first_done = threading.Event(), threading.Event(), threading.Event()

    def build(tmp: Path) -> None:
        (tmp / "a.bin").write_bytes(b"x" * 100)
        if not first_building.is_set():
            first_building.set()  # the second builder starts only now, so it sees this temporary
            assert second_building.wait(timeout=10)
        else:
            second_building.set()  # both are building; the first renames first, the second must cope
            assert first_done.wait(timeout=10)

    def complete(d: Path) -> bool:
        return (d / "a.bin").is_file() and (d / "a.bin").stat().st_size == 100

    results: list[Path] = []

    def fetch(done: threading.Event) -> None:
        try:
            results.append(cache.cached_entry(tmp_path, "e", complete, build))
        finally:
            done.set()

    threads = [threading.Thread(target=fetch, args=(e,)) for e in (first_done, threading.Event())]
    threads[0].start()
    assert first_building.wait(timeout=10)
    threads[1].start()
    for t in threads:
        t.join(timeout=30)
    assert results == [tmp_path / "e", tmp_path / "e"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".e.lock", "e"]  # no temporary left behind
