"""Small helpers shared by staged models (``objects.py``) and input files (``input_files.py``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from dockflow.config import CheckpointConfig
from dockflow.storage.s3_bucket import S3Bucket
from dockflow.storage.s3_client import S3Options

READ_PERMISSIONS = "s3:ListBucket and s3:GetObject"
WRITE_PERMISSIONS = "s3:ListBucket, s3:GetObject and s3:PutObject"


def is_s3_uri(uri: str | Path | None) -> bool:
    """Whether ``uri`` names an object store location (``s3://``) rather than a local path."""
    return isinstance(uri, str) and uri.startswith("s3://")


def text_digest(text: str) -> str:
    """sha256 hex of a string (cache keys)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def open_bucket(name: str, url: str, ckpt: CheckpointConfig, what: str, write: bool) -> S3Bucket:
    """``name`` at the run's S3 endpoint (``checkpoint.s3_*``, then env), its errors worded for reading ``what``
    from ``url`` or (``write``) for staging there."""
    opts = S3Options.from_config(ckpt)
    if write:
        advice = "create it (e.g. `mc mb <alias>/{bucket}`) or set checkpoint.s3_create_bucket: true"
    else:
        advice = (
            f"check the bucket of {url} and checkpoint.s3_endpoint (now from {opts.endpoint_source}), "
            f"or upload {what} there first"
        )
    return S3Bucket(name, opts, missing_advice=advice, permissions=WRITE_PERMISSIONS if write else READ_PERMISSIONS)
