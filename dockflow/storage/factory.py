"""Open the checkpoint store a run's config asks for.

    store = open_store(cfg.checkpoint, run_dir)   # checkpoint.dir null -> <run_dir>/checkpoints
                                                  # checkpoint.dir s3://bucket/prefix -> S3/MinIO
"""

from __future__ import annotations

from pathlib import Path

from dockflow.config import CheckpointConfig
from dockflow.storage.base import CheckpointStore
from dockflow.storage.local import LocalCheckpointStore
from dockflow.storage.manifest import CheckpointError
from dockflow.storage.s3 import S3CheckpointStore


def open_store(cfg: CheckpointConfig, run_dir: str | Path) -> CheckpointStore:
    """The store for ``cfg.dir`` (a local path, or ``s3://bucket/prefix``; null = ``<run_dir>/checkpoints``)
    with the retention of ``cfg`` (last ``keep``, plus the best by ``best_metric`` when ``keep_best``)."""
    target = cfg.dir if cfg.dir is not None else str(Path(run_dir) / "checkpoints")
    if target.startswith("s3://"):
        return S3CheckpointStore.from_config(target, cfg)
    if "://" in target:
        scheme = target.split("://", 1)[0]
        raise CheckpointError(
            f"checkpoint.dir '{target}': the '{scheme}://' backend is not available; "
            "use a local directory path or s3://bucket/prefix (S3, MinIO)"
        )
    best_metric = cfg.best_metric if cfg.keep_best else None
    return LocalCheckpointStore(target, keep=cfg.keep, best_metric=best_metric, best_mode=cfg.best_mode)
