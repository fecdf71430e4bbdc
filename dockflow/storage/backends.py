"""Open the checkpoint store a run's config asks for.

    store = open_store(cfg.checkpoint, run_dir)   # checkpoint.dir null -> <run_dir>/checkpoints
                                                  # checkpoint.dir s3://bucket/prefix -> S3/MinIO
    store = run_store(cfg.checkpoint, cfg.run)     # the run's own: <checkpoint.dir>/<run.name>
"""

from __future__ import annotations

from pathlib import Path

from dockflow.config.sections import CheckpointConfig, RunConfig
from dockflow.storage.checkpoint_store import CheckpointStore
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


def run_store(checkpoint: CheckpointConfig, run: RunConfig) -> CheckpointStore:
    """The store of run ``run.name``: ``<checkpoint.dir>/<run.name>`` (a directory or ``s3://bucket/prefix``),
    or ``<run.output_dir>/<run.name>/checkpoints`` when ``checkpoint.dir`` is null; so runs sharing one
    checkpoint root never mix their checkpoints."""
    run_dir = Path(run.output_dir) / run.name
    root = checkpoint.dir
    if root is None:
        return open_store(checkpoint, run_dir)
    if "/" in run.name or run.name in ("", ".", ".."):
        raise CheckpointError(f"run.name '{run.name}' cannot name a checkpoint folder: use one path segment")
    target = f"{root.rstrip('/')}/{run.name}" if "://" in root else str(Path(root) / run.name)
    return open_store(checkpoint.model_copy(update={"dir": target}), run_dir)
