"""Fixtures that run the checkpoint-store tests on both backends: a local directory and S3 (moto on loopback)."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest

from dockflow.config import CheckpointConfig
from dockflow.storage import CheckpointStore, LocalCheckpointStore, S3CheckpointStore
from dockflow.storage.manifest import step_dirname
from dockflow.storage.s3 import S3Options

MakeStore = Callable[..., CheckpointStore]


@pytest.fixture(params=["local", "s3"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> MakeStore:
    """``make_store(keep=3, best_metric=None, best_mode="max")``: a store on an empty local directory or
    S3 prefix; every call of one test opens the same place."""
    if request.param == "local":
        return lambda keep=3, **kw: LocalCheckpointStore(tmp_path / "ckpt", keep=keep, **kw)
    url = request.getfixturevalue("s3_checkpoint_dir")
    return lambda keep=3, **kw: S3CheckpointStore(
        url, keep=keep, options=S3Options.from_config(CheckpointConfig()), **kw
    )


class RawFiles:
    """Reach around a store to damage its files, the way a crash or a bad disk would."""

    @staticmethod
    def put(store: CheckpointStore, step: int, filename: str, data: bytes) -> None:
        if isinstance(store, LocalCheckpointStore):
            (store.root / step_dirname(step) / filename).write_bytes(data)
        else:
            assert isinstance(store, S3CheckpointStore)
            store._client.put_object(store.bucket, store._key(step, filename), io.BytesIO(data), len(data))

    @staticmethod
    def get(store: CheckpointStore, step: int, filename: str) -> bytes:
        if isinstance(store, LocalCheckpointStore):
            return (store.root / step_dirname(step) / filename).read_bytes()
        assert isinstance(store, S3CheckpointStore)
        resp = store._client.get_object(store.bucket, store._key(step, filename))
        try:
            return resp.read()
        finally:
            resp.close()
            resp.release_conn()

    @staticmethod
    def delete(store: CheckpointStore, step: int, filename: str) -> None:
        if isinstance(store, LocalCheckpointStore):
            (store.root / step_dirname(step) / filename).unlink()
        else:
            assert isinstance(store, S3CheckpointStore)
            store._client.remove_object(store.bucket, store._key(step, filename))


@pytest.fixture
def raw() -> type[RawFiles]:
    return RawFiles
