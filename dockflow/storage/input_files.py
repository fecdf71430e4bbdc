"""Single input files (JSONL/Parquet datasets) from a local path or an ``s3://bucket/key`` URI.

    path = fetch_file(cfg.data.train_path, cfg.checkpoint)   # local path as is; s3:// -> the node's cache

An ``s3://`` file is downloaded into ``<cache>/files/<name>-<uri hash>-<content hash>/<name>`` (``cache.py``:
``$DOCKFLOW_CACHE_DIR`` or ``~/.cache/dockflow``) and checked: its size, the sha256 in its metadata
(``x-amz-meta-sha256``, which ``stage_model`` and the checkpoint store set) when present, else the MD5 against
its ETag when that is a plain MD5 (single-part, unencrypted upload). A cached copy of the same content (same
sha256 or ETag) is reused after a size check, so every process of a node downloads a file once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dockflow.config import CheckpointConfig
from dockflow.storage.cache import cache_root, cached_entry, entry_name
from dockflow.storage.dir_manifest import is_model_file
from dockflow.storage.manifest import CheckpointError, sha256_file
from dockflow.storage.remote import is_s3_uri, open_bucket, text_digest
from dockflow.storage.s3_bucket import SHA256_HEADER, S3Bucket
from dockflow.storage.s3_client import parse_s3_url

_DATA_KEYS = "data.train_path, data.test_path or the algorithm's pairs_path"


@dataclass
class _RemoteFile:
    url: str
    bucket: S3Bucket
    key: str
    size: int
    etag: str
    sha256: str | None  # from the object's x-amz-meta-sha256, when its uploader set one

    @property
    def fingerprint(self) -> str:
        return f"sha256:{self.sha256}" if self.sha256 else f"etag:{self.etag}:{self.size}"


def _open_file(uri: str, ckpt: CheckpointConfig) -> _RemoteFile:
    bucket, key = parse_s3_url(uri, "dataset URI")
    url = f"s3://{bucket}/{key}"
    if not key or uri.endswith("/"):
        raise CheckpointError(f"dataset URI '{uri}' names no file: give s3://bucket/path/to/file.jsonl")
    b = open_bucket(bucket, url, ckpt, "the file", write=False)
    b.ensure(key, create=False)  # a listing: its errors are worded precisely (a HEAD answer has no body)
    st = b.stat(key)
    if st is None:
        raise CheckpointError(
            f"no object {url} at {b.options.endpoint_url}: check the URI ({_DATA_KEYS}), or upload the file there"
        )
    meta = (st.metadata or {}).get(SHA256_HEADER)
    return _RemoteFile(url, b, key, st.size or 0, (st.etag or "").strip('"'), meta)


def _download_file(remote: _RemoteFile, path: Path) -> None:
    with open(path, "wb") as f:
        got = remote.bucket.download(remote.key, f, md5=not remote.sha256)
    if got is None or got.size != remote.size or (got.etag and got.etag != remote.etag):
        raise CheckpointError(f"{remote.url} changed or vanished during the fetch: fetch again once it is uploaded")
    if remote.sha256 and got.sha256 != remote.sha256:
        raise CheckpointError(
            f"{remote.url} is corrupt: its sha256 differs from the one in its metadata ({SHA256_HEADER}): upload it again"
        )
    if not remote.sha256 and got.etag_is_md5 and got.md5 != got.etag:
        raise CheckpointError(
            f"{remote.url} is corrupt: the MD5 of its {got.size} bytes differs from its ETag {got.etag}: upload it again"
        )


def fetch_file(uri: str | Path, ckpt: CheckpointConfig, cache_dir: str | Path | None = None) -> Path:
    """A local path of the file at ``uri``: a local path as is (not checked), an ``s3://bucket/key`` downloaded
    (checked) into the node's cache under its own name, or its cached copy."""
    if not is_s3_uri(uri):
        return Path(uri)
    remote = _open_file(str(uri), ckpt)
    filename = remote.key.rsplit("/", 1)[-1]
    if not is_model_file(filename):
        filename = "_" + filename  # a hidden name would read as a temporary file
    name = entry_name(filename, text_digest(remote.url)[:12], text_digest(remote.fingerprint)[:16])

    def complete(d: Path) -> bool:
        return (d / filename).is_file() and (d / filename).stat().st_size == remote.size

    entry = cached_entry(
        cache_root(cache_dir) / "files", name, complete, lambda tmp: _download_file(remote, tmp / filename)
    )
    return entry / filename


def file_fingerprint(uri: str | Path | None, ckpt: CheckpointConfig) -> str | None:
    """What identifies a file's bytes without downloading it: for ``s3://``, the sha256 in its metadata or its
    ETag and size; for a local file, its sha256 (None when there is no such file)."""
    if not uri:
        return None
    if is_s3_uri(uri):
        return _open_file(str(uri), ckpt).fingerprint
    p = Path(uri)
    return sha256_file(p)[1] if p.is_file() else None
