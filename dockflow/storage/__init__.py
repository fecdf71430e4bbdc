"""Checkpoint storage: write parts, commit them atomically with a manifest, resume from the latest.

    from dockflow.storage import open_store
    store = open_store(cfg.checkpoint, run_dir)
    store.write_part(step, "actor", state_dict); store.commit(step, {"iteration": step})
    step = store.latest(); state = store.read_part(step, "actor")

Backends: ``LocalCheckpointStore`` (a directory) and ``S3CheckpointStore`` (``checkpoint.dir: s3://bucket/prefix``).

Models and input files (``objects.py``): ``stage_model`` copies a model directory to a directory or S3 prefix
(manifest last); ``fetch_model``/``fetch_file`` give a checked local copy of a path or ``s3://`` URI.
"""

from dockflow.storage.backends import open_store, run_store
from dockflow.storage.checkpoint_store import CheckpointStore
from dockflow.storage.local import LocalCheckpointStore
from dockflow.storage.manifest import CheckpointError, Manifest, OldCheckpointError, PartInfo
from dockflow.storage.objects import (
    fetch_file,
    fetch_model,
    file_fingerprint,
    is_s3_uri,
    model_fingerprint,
    stage_model,
    staged_model_exists,
)
from dockflow.storage.s3 import S3CheckpointStore

__all__ = [
    "CheckpointError",
    "CheckpointStore",
    "LocalCheckpointStore",
    "Manifest",
    "OldCheckpointError",
    "PartInfo",
    "S3CheckpointStore",
    "fetch_file",
    "fetch_model",
    "file_fingerprint",
    "is_s3_uri",
    "model_fingerprint",
    "open_store",
    "run_store",
    "stage_model",
    "staged_model_exists",
]
