"""Models and input files on a store: stage a model directory, fetch models and files into the node's cache.

    uri = stage_model(sft_dir, "s3://ckpt/runs/grpo/models/sft", cfg.checkpoint)   # files first, manifest last
    local = fetch_model(uri, cfg.checkpoint)           # any worker, any pod: a checked copy in its node's cache
    train = fetch_file("s3://data/train.jsonl", cfg.checkpoint)

- A staged model is its files plus ``dockflow-manifest.json`` (path, size, sha256 of each; ``dir_manifest.py``)
  written LAST, so it exists iff its manifest exists. Staging is idempotent: when the destination's manifest
  already describes exactly these files nothing is written (a resumed run uploads nothing), and a file whose
  object already has the same size and sha256 (an interrupted staging) is not uploaded again.
- ``fetch_model``/``fetch_file`` return local paths as they are, and download ``s3://`` URIs into the node's
  cache (``cache.py``: ``$DOCKFLOW_CACHE_DIR`` or ``~/.cache/dockflow``), keyed by the URI and the content's
  digest (manifest, or ETags), checking every byte: sha256 against the manifest; for an upload without one
  (a user's ``mc cp``), the size and, where the ETag is a plain MD5 (single-part, unencrypted), the MD5. A
  cached copy is reused after a cheap check (file sizes against its recorded manifest).
- S3 settings are those of the run's checkpoints (``checkpoint.s3_*``, then the environment), so models,
  data and checkpoints share one endpoint and one set of keys. Every failure is a one-line CheckpointError
  naming the URI and what to do.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from dockflow.config import CheckpointConfig
from dockflow.storage.cache import cache_root, cached_entry, entry_name
from dockflow.storage.dir_manifest import (
    DIR_MANIFEST,
    DirManifest,
    FileEntry,
    check_relpath,
    is_model_file,
    read_dir_manifest,
    scan_dir,
    size_problems,
    write_dir_manifest,
)
from dockflow.storage.input_files import fetch_file, file_fingerprint
from dockflow.storage.manifest import CheckpointError
from dockflow.storage.remote import is_s3_uri, open_bucket, text_digest
from dockflow.storage.s3_bucket import SHA256_HEADER, Downloaded, S3Bucket
from dockflow.storage.s3_client import parse_s3_url
from dockflow.storage.write_errors import no_room

log = logging.getLogger(__name__)

THREADS = 4  # files of one model transferred at once


def _parallel(fn: Callable[[str], FileEntry | None], rels: Iterable[str]) -> dict[str, FileEntry | None]:
    """``fn`` over ``rels`` on ``THREADS`` threads; the first error cancels what has not started and is raised."""
    rels = sorted(rels)
    with ThreadPoolExecutor(max(1, min(THREADS, len(rels)))) as pool:
        futures = [pool.submit(fn, rel) for rel in rels]
        try:
            return {rel: f.result() for rel, f in zip(rels, futures, strict=True)}
        except BaseException:
            for f in futures:
                f.cancel()
            raise


@dataclass
class _RemoteModel:
    """A model under an S3 prefix: its manifest, or (a user's upload) the listing: path -> (size, ETag)."""

    url: str
    bucket: S3Bucket
    root: str  # key prefix of its files: 'a/b/', or '' at the top of the bucket
    manifest: DirManifest | None
    listing: dict[str, tuple[int, str]] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        if self.manifest is not None:
            return f"manifest:{self.manifest.digest}"
        return f"etags:{text_digest(json.dumps(sorted(self.listing.items())))}"


def _open_model(uri: str, ckpt: CheckpointConfig) -> _RemoteModel:
    bucket, prefix = parse_s3_url(uri, "model URI")
    url = f"s3://{bucket}/{prefix}".rstrip("/")
    b = open_bucket(bucket, url, ckpt, "the model", write=False)
    root = f"{prefix}/" if prefix else ""
    text = b.get_text(root + DIR_MANIFEST)
    if text is not None:
        return _RemoteModel(url, b, root, DirManifest.from_json(text, f"{url}/{DIR_MANIFEST}"))
    listing = {}
    for o in b.list(root):
        rel = o.object_name[len(root) :]
        if is_model_file(rel):
            listing[check_relpath(rel, url)] = (o.size or 0, o.etag or "")
    if not listing:
        raise CheckpointError(
            f"no model at {url}: nothing under that prefix at {b.options.endpoint_url}: check the URI, or upload a "
            f"Hugging Face model directory there (e.g. `mc cp --recursive DIR <alias>/{bucket}/{prefix}/`)"
        )
    return _RemoteModel(url, b, root, None, listing)


def _check_model_file(remote: _RemoteModel, rel: str, got: Downloaded | None) -> FileEntry:
    """The downloaded file's entry after checking it against the manifest, or the listing and its ETag."""
    where = f"{remote.url}/{rel}"
    if got is None:
        raise CheckpointError(f"{where} is missing though {DIR_MANIFEST} lists it: stage the model again")
    if remote.manifest is not None:
        want = remote.manifest.files[rel]
        if (got.size, got.sha256) != (want.size, want.sha256):
            raise CheckpointError(
                f"{where} is corrupt: {got.size} bytes with sha256 {got.sha256[:12]}..., but {DIR_MANIFEST} says "
                f"{want.size} bytes with sha256 {want.sha256[:12]}...: stage the model again"
            )
    else:
        size = remote.listing[rel][0]
        if got.size != size:
            raise CheckpointError(
                f"{where}: downloaded {got.size} bytes but the listing says {size}: the object changed during the "
                "fetch; fetch again once the upload is complete"
            )
        if got.etag_is_md5 and got.md5 != got.etag:
            raise CheckpointError(
                f"{where} is corrupt: the MD5 of its {got.size} bytes differs from its ETag {got.etag}: "
                "upload that file again"
            )
    return FileEntry(got.size, got.sha256)


def _download_model(remote: _RemoteModel, tmp: Path) -> None:
    rels = remote.manifest.files if remote.manifest is not None else remote.listing
    t0 = time.monotonic()

    def one(rel: str) -> FileEntry:
        dest = tmp / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as f:
            got = remote.bucket.download(remote.root + rel, f, md5=remote.manifest is None)
        return _check_model_file(remote, rel, got)

    entries = _parallel(one, rels)
    manifest = DirManifest({rel: e for rel, e in entries.items() if e is not None})
    write_dir_manifest(tmp, manifest)  # the copy's own record: later uses re-check sizes against it
    log.info(
        "fetched %s (%d files, %.1f MB) in %.1f s",
        *(remote.url, len(manifest.files), manifest.total_size / 1e6, time.monotonic() - t0),
    )


def _local_model(p: Path) -> Path:
    if not p.is_dir():
        raise CheckpointError(
            f"model directory '{p}' does not exist: set model.path to a local Hugging Face model directory "
            "or to an s3://bucket/prefix URI"
        )
    manifest = read_dir_manifest(p)
    problems = size_problems(p, manifest) if manifest is not None else []
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckpointError(
            f"model directory '{p}' does not match its {DIR_MANIFEST}: {problems[0]}{more}: copy or stage the "
            "model again"
        )
    return p


def fetch_model(uri: str | Path, ckpt: CheckpointConfig, cache_dir: str | Path | None = None) -> Path:
    """A local directory holding the model at ``uri``: a local path as is (sizes checked against its manifest,
    if any), an ``s3://bucket/prefix`` downloaded (checked) into the node's cache, or its cached copy."""
    if not is_s3_uri(uri):
        return _local_model(Path(uri))
    remote = _open_model(str(uri), ckpt)

    def complete(d: Path) -> bool:
        try:
            recorded = read_dir_manifest(d)
        except CheckpointError:
            return False
        if recorded is None:
            return False
        if remote.manifest is not None and recorded.files != remote.manifest.files:
            return False
        if remote.manifest is None and {r: e.size for r, e in recorded.files.items()} != {
            r: s for r, (s, _) in remote.listing.items()
        }:
            return False
        return not size_problems(d, recorded)

    label = remote.url.rsplit("/", 1)[-1]
    name = entry_name(label, text_digest(remote.url)[:12], text_digest(remote.fingerprint)[:16])
    return cached_entry(cache_root(cache_dir) / "models", name, complete, lambda tmp: _download_model(remote, tmp))


def model_fingerprint(uri: str | Path, ckpt: CheckpointConfig) -> str:
    """What identifies the model's bytes without downloading them: for ``s3://``, its manifest's digest (or a
    digest of its objects' names, sizes and ETags); for a local path, the resolved path."""
    if not is_s3_uri(uri):
        return str(Path(uri).resolve())
    return _open_model(str(uri), ckpt).fingerprint


def staged_model_exists(dest: str | Path, ckpt: CheckpointConfig) -> bool:
    """Whether ``dest`` (a local directory or ``s3://bucket/prefix``) holds a staged model: its manifest exists
    (and parses). Nothing is downloaded but the manifest."""
    if not is_s3_uri(dest):
        return read_dir_manifest(Path(dest)) is not None
    bucket, prefix = parse_s3_url(str(dest), "model destination")
    url = f"s3://{bucket}/{prefix}".rstrip("/")
    text = open_bucket(bucket, url, ckpt, "the model", write=False).get_text(f"{prefix}/{DIR_MANIFEST}".lstrip("/"))
    if text is None:
        return False
    DirManifest.from_json(text, f"{url}/{DIR_MANIFEST}")
    return True


def _stage_s3(src: Path, manifest: DirManifest, dest: str, ckpt: CheckpointConfig) -> str:
    bucket, prefix = parse_s3_url(dest, "model destination")
    url = f"s3://{bucket}/{prefix}".rstrip("/")
    b = open_bucket(bucket, url, ckpt, "the model", write=True)
    root = f"{prefix}/" if prefix else ""
    b.ensure(root, create=b.options.create_bucket)
    manifest_key = root + DIR_MANIFEST
    text = b.get_text(manifest_key)
    if text is not None:
        if DirManifest.from_json(text, f"{url}/{DIR_MANIFEST}").files == manifest.files:
            log.info("model %s is already staged at %s", src, url)
            return url
        # Another model is there: it stops existing before any of its files change.
        b.call("delete", manifest_key, lambda: b.client.remove_object(bucket, manifest_key))

    def one(rel: str) -> None:
        entry = manifest.files[rel]
        st = b.stat(root + rel)
        if st is not None and st.size == entry.size and (st.metadata or {}).get(SHA256_HEADER) == entry.sha256:
            return None  # uploaded by an interrupted staging
        b.upload_file(root + rel, src / rel, entry.size, entry.sha256)
        return None

    _parallel(one, manifest.files)
    b.put_bytes(manifest_key, manifest.to_json().encode("utf-8"))
    return url


def _stage_local(src: Path, manifest: DirManifest, dest: Path) -> str:
    try:
        dest.mkdir(parents=True, exist_ok=True)
        try:
            old = read_dir_manifest(dest)
        except CheckpointError:
            old = None
        if old is not None and old.files == manifest.files and not size_problems(dest, old):
            return str(dest)
        (dest / DIR_MANIFEST).unlink(missing_ok=True)
        if src.resolve() != dest.resolve():
            for rel in sorted(manifest.files):
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
                try:
                    shutil.copyfile(src / rel, tmp)
                    os.replace(tmp, target)
                finally:
                    tmp.unlink(missing_ok=True)
        write_dir_manifest(dest, manifest)
    except OSError as exc:
        reason = no_room(exc) or f"{type(exc).__name__}: {exc}"
        raise CheckpointError(
            f"cannot stage model {src} into {dest} ({reason}): give a writable directory with room for the model"
        ) from None
    return str(dest)


def stage_model(local_dir: str | Path, dest: str | Path, ckpt: CheckpointConfig) -> str:
    """Copy the model directory ``local_dir`` to ``dest`` (a local directory or ``s3://bucket/prefix``): every
    file, then ``dockflow-manifest.json`` LAST; nothing is written when ``dest`` already holds exactly these
    files. Returns ``dest`` (an ``s3://`` URI without trailing '/', or the local path)."""
    src = Path(local_dir)
    if not src.is_dir():
        raise CheckpointError(f"cannot stage model '{src}': it is not a directory")
    t0 = time.monotonic()
    manifest = scan_dir(src)
    if not manifest.files:
        raise CheckpointError(f"cannot stage model '{src}': it holds no files")
    out = _stage_s3(src, manifest, str(dest), ckpt) if is_s3_uri(dest) else _stage_local(src, manifest, Path(dest))
    log.info("staged %s at %s (%d files) in %.1f s", src, out, len(manifest.files), time.monotonic() - t0)
    return out


__all__ = [
    "DIR_MANIFEST",
    "fetch_file",
    "fetch_model",
    "file_fingerprint",
    "is_s3_uri",
    "model_fingerprint",
    "stage_model",
    "staged_model_exists",
]
