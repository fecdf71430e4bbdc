"""Checkpoint layout shared by every backend: names, part records, the manifest, streaming checksums.

A checkpoint of step 10 is a folder (local) or key prefix (object store) ``step-000010/`` holding:

- ``<name>.safetensors``: one part per writer, data only (``dockflow.storage.part_format``: tensors in
  safetensors, the rest of the tree as JSON in its metadata; nothing in it is unpickled when read);
- ``<name>.safetensors.json``: the part's record (size + sha256), written by the part's writer right after it;
- ``manifest.json``: written last, by ``commit``; a checkpoint is committed iff its manifest exists. With a
  checkpoint key (``dockflow.storage.signing``) it carries an HMAC of its content, checked before any part is read.

Format 1 (DockFlow before data-only parts: ``<name>.pt``, written by ``torch.save``) is refused in one line
(``OldCheckpointError``): loading it would unpickle whatever the bucket holds.

Nothing here touches storage; the backends do.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

FORMAT_VERSION = 2  # 1: pickled parts (torch.save), refused
MANIFEST_NAME = "manifest.json"
PART_SUFFIX = ".safetensors"
RECORD_SUFFIX = ".safetensors.json"

_STEP_RE = re.compile(r"^step-(\d{6,})$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written, committed or read; the message names the path and what to do."""


class OldCheckpointError(CheckpointError):
    """A checkpoint of format 1 (pickled parts): never loaded, and never skipped silently by ``latest``."""


def step_dirname(step: int) -> str:
    """``10 -> 'step-000010'`` (zero-padded so that names sort like steps)."""
    check_step(step)
    return f"step-{step:06d}"


def parse_step_dirname(name: str) -> int | None:
    """``'step-000010' -> 10``; None for names that are not checkpoint folders."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def steps_of_paths(paths: Iterable[str]) -> dict[int, bool]:
    """Steps found in paths relative to the store's root (``'step-000010/actor.safetensors'``) and whether each is
    committed (has ``manifest.json``); other paths are ignored."""
    out: dict[int, bool] = {}
    for path in paths:
        folder, _, filename = path.partition("/")
        step = parse_step_dirname(folder)
        if step is not None and filename and "/" not in filename:
            out[step] = out.get(step, False) or filename == MANIFEST_NAME
    return out


def check_step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"checkpoint step must be a non-negative int, got {step!r}")
    return step


def check_part_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise CheckpointError(
            f"invalid checkpoint part name {name!r}: use letters, digits, '_', '-', '.' "
            "(e.g. 'actor', 'optimizer.rank0'), starting with a letter or digit"
        )
    return name


def part_filename(name: str) -> str:
    return name + PART_SUFFIX


def record_filename(name: str) -> str:
    return name + RECORD_SUFFIX


@dataclass(frozen=True)
class PartInfo:
    """What the manifest records of one part."""

    name: str
    size: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": part_filename(self.name), "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, name: str, d: dict[str, Any]) -> PartInfo:
        return cls(name=name, size=int(d["size"]), sha256=str(d["sha256"]))


@dataclass
class Manifest:
    """The commit record of one checkpoint: its step, the caller's metadata and every part."""

    step: int
    meta: dict[str, Any]
    parts: dict[str, PartInfo]
    created_unix: float = field(default_factory=time.time)

    def body(self) -> dict[str, Any]:
        """The manifest's content, without its signature."""
        return {
            "format_version": FORMAT_VERSION,
            "step": self.step,
            "created_unix": self.created_unix,
            "meta": self.meta,
            "parts": {n: p.to_dict() for n, p in sorted(self.parts.items())},
        }

    def to_json(self, key: bytes | None = None) -> str:
        """The manifest file; with ``key``, signed (``signature``: HMAC-SHA256 of the canonical body)."""
        d = self.body()
        if key is not None:
            d["signature"] = signature(d, key)
        return json.dumps(d, indent=1)

    @classmethod
    def from_json(cls, text: str, where: str, key: bytes | None = None) -> Manifest:
        """Parse a manifest; ``where`` (its path) goes into the error message. With ``key`` its signature must
        match (an unsigned manifest, or one signed with another key, is refused)."""
        try:
            d = json.loads(text)
            version = d.get("format_version")
        except (ValueError, AttributeError) as exc:
            raise CheckpointError(f"manifest {where} is unreadable ({exc}): delete that checkpoint") from None
        if version == 1:
            raise OldCheckpointError(
                f"checkpoint {where.rsplit('/', 1)[0]} has pickled parts (format 1, DockFlow before data-only "
                "checkpoints), which this DockFlow never loads: resume it with the DockFlow that wrote it, or start "
                "afresh with another checkpoint.dir (or delete its step-* folders)"
            )
        if key is not None:
            check_signature(d, key, where)
        try:
            if version != FORMAT_VERSION:
                raise ValueError(f"format_version {version!r}, expected {FORMAT_VERSION}")
            parts = {n: PartInfo.from_dict(n, p) for n, p in d["parts"].items()}
            return cls(step=int(d["step"]), meta=dict(d["meta"]), parts=parts, created_unix=float(d["created_unix"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"manifest {where} is unreadable ({exc}): delete that checkpoint") from None


def signature(body: dict[str, Any], key: bytes) -> str:
    """HMAC-SHA256 (hex) of a manifest body, over its canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps({k: v for k, v in body.items() if k != "signature"}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, canonical.encode("utf-8"), hashlib.sha256).hexdigest()


def check_signature(d: dict[str, Any], key: bytes, where: str) -> None:
    """Raise unless the parsed manifest ``d`` carries the signature ``key`` makes of it."""
    got = d.get("signature")
    if not isinstance(got, str):
        raise CheckpointError(
            f"manifest {where} is not signed, but a checkpoint key is set (DOCKFLOW_CHECKPOINT_KEY): it was written "
            "without the key, or by someone else; resume from a signed checkpoint"
        )
    if not hmac.compare_digest(got, signature(d, key)):
        raise CheckpointError(
            f"manifest {where} has a signature that does not match this run's checkpoint key "
            "(DOCKFLOW_CHECKPOINT_KEY): it was changed after it was written, or signed with another key"
        )


def record_json(info: PartInfo) -> str:
    return json.dumps(info.to_dict())


def parse_record(text: str, name: str, where: str) -> PartInfo:
    try:
        return PartInfo.from_dict(name, json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"part record {where} is unreadable ({exc}): write part '{name}' again") from None


def meta_json_check(meta: dict[str, Any]) -> dict[str, Any]:
    """Checkpoint metadata must be a JSON-serializable dict (it lives in the manifest)."""
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint meta must be a dict, got {type(meta).__name__}")
    for key, value in meta.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(
                f"checkpoint meta key {key!r} is not JSON-serializable ({exc}): store it as a part instead"
            ) from None
    return meta


class HashingWriter:
    """Write-only file wrapper that counts bytes and computes sha256 as a part (or a download)
    streams into it; with ``f=None`` the bytes are only counted and hashed. ``md5=True`` also computes their MD5
    (to compare with an S3 ETag)."""

    def __init__(self, f: BinaryIO | None = None, md5: bool = False) -> None:
        self._f = f
        self._h = hashlib.sha256()
        self._md5 = hashlib.md5(usedforsecurity=False) if md5 else None
        self.size = 0

    def write(self, data: bytes) -> int:
        self._h.update(data)
        if self._md5 is not None:
            self._md5.update(data)
        self.size += len(data)
        return self._f.write(data) if self._f is not None else len(data)

    def flush(self) -> None:
        if self._f is not None:
            self._f.flush()

    @property
    def sha256(self) -> str:
        return self._h.hexdigest()

    @property
    def md5(self) -> str | None:
        return self._md5.hexdigest() if self._md5 is not None else None


def sha256_file(path: Path, chunk: int = 1 << 20) -> tuple[int, str]:
    """(size, sha256 hex) of a file, read in chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
            size += len(block)
    return size, h.hexdigest()
