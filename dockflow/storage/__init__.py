"""Checkpoint storage: write parts, commit them atomically with a manifest, resume from the latest.

    from dockflow.storage import open_store
    store = open_store(cfg.checkpoint, run_dir)
    store.write_part(step, "actor", state_dict); store.commit(step, {"iteration": step})
    step = store.latest(); state = store.read_part(step, "actor")

Backends: ``LocalCheckpointStore`` (a directory) and ``S3CheckpointStore`` (``checkpoint.dir: s3://bucket/prefix``).
"""

from dockflow.storage.base import CheckpointStore
from dockflow.storage.factory import open_store
from dockflow.storage.local import LocalCheckpointStore
from dockflow.storage.manifest import CheckpointError, Manifest, PartInfo
from dockflow.storage.s3 import S3CheckpointStore

__all__ = [
    "CheckpointError",
    "CheckpointStore",
    "LocalCheckpointStore",
    "Manifest",
    "PartInfo",
    "S3CheckpointStore",
    "open_store",
]
