"""Open the checkpoint store a run's config asks for.

    store = open_store(cfg.checkpoint, run_dir)   # checkpoint.dir null -> <run_dir>/checkpoints
"""

from __future__ import annotations

from pathlib import Path

from dockflow.config import CheckpointConfig
from dockflow.storage.base import CheckpointStore
from dockflow.storage.local import LocalCheckpointStore
from dockflow.storage.manifest import CheckpointError


def open_store(cfg: CheckpointConfig, run_dir: str | Path) -> CheckpointStore:
    """The store for ``cfg.dir`` (a local path; null = ``<run_dir>/checkpoints``) keeping ``cfg.keep``."""
    target = cfg.dir if cfg.dir is not None else str(Path(run_dir) / "checkpoints")
    if "://" in target:
        scheme = target.split("://", 1)[0]
        raise CheckpointError(
            f"checkpoint.dir '{target}': the '{scheme}://' backend is not available in this version; "
            "use a local directory path"
        )
    return LocalCheckpointStore(target, keep=cfg.keep)
