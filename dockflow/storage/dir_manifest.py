"""The manifest of a staged model directory: every file's relative path, size and sha256.

``dockflow-manifest.json`` sits at the top of a staged model (a local directory or an ``s3://`` prefix) and is
written LAST, so a staged model exists iff its manifest exists. Its JSON is deterministic (sorted, no time
stamp), so staging the same files twice gives the same manifest and the same ``digest``::

    {"format": "dockflow-dir", "format_version": 1,
     "files": {"config.json": {"size": 712, "sha256": "..."}, "model.safetensors": {...}}}

Files and folders whose name starts with ``.`` (temporary files, ``.cache/``, ``.git/``) are not part of a
model; neither is the manifest itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from dockflow.storage.manifest import CheckpointError, sha256_file

DIR_MANIFEST = "dockflow-manifest.json"
FORMAT = "dockflow-dir"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class FileEntry:
    """Size and sha256 of one file of a model directory."""

    size: int
    sha256: str


def is_model_file(rel: str) -> bool:
    """Whether a relative path belongs to a model: not the manifest, no hidden file or folder on its way."""
    return rel != DIR_MANIFEST and not any(part.startswith(".") for part in rel.split("/"))


def check_relpath(rel: str, where: str) -> str:
    """``rel`` if it is a safe relative path (``a/b.json``): no leading '/', no empty, '.' or '..' segment."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        raise CheckpointError(f"{where}: '{rel}' is not a plain relative file path; stage the model again")
    return rel


@dataclass
class DirManifest:
    """Relative path -> ``FileEntry`` of every file of a model directory."""

    files: dict[str, FileEntry]

    def to_json(self) -> str:
        files = {rel: {"size": e.size, "sha256": e.sha256} for rel, e in sorted(self.files.items())}
        return json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION, "files": files}, indent=1)

    @property
    def digest(self) -> str:
        """sha256 of the manifest's JSON: names the exact bytes of the whole model."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    @property
    def total_size(self) -> int:
        return sum(e.size for e in self.files.values())

    @classmethod
    def from_json(cls, text: str, where: str) -> DirManifest:
        """Parse a manifest; ``where`` (its path or URI) goes into the error message."""
        try:
            d = json.loads(text)
            if d.get("format") != FORMAT or d.get("format_version") != FORMAT_VERSION:
                raise ValueError(f"format {d.get('format')!r} v{d.get('format_version')!r}, expected {FORMAT} v1")
            files = {
                check_relpath(str(rel), where): FileEntry(int(e["size"]), str(e["sha256"]))
                for rel, e in d["files"].items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"model manifest {where} is unreadable ({exc}): stage the model again") from None
        return cls(files)


def scan_dir(root: Path) -> DirManifest:
    """Hash every model file under ``root`` (recursively; symlinks to files are followed)."""
    files: dict[str, FileEntry] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and is_model_file(rel):
            size, digest = sha256_file(path)
            files[rel] = FileEntry(size, digest)
    return DirManifest(files)


def read_dir_manifest(root: Path) -> DirManifest | None:
    """The manifest of a local model directory, None if it has none."""
    path = root / DIR_MANIFEST
    if not path.is_file():
        return None
    return DirManifest.from_json(path.read_text(encoding="utf-8"), str(path))


def size_problems(root: Path, manifest: DirManifest) -> list[str]:
    """Files of ``manifest`` that are missing under ``root`` or have another size (a cheap check)."""
    problems = []
    for rel, entry in sorted(manifest.files.items()):
        path = root / rel
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif (size := path.stat().st_size) != entry.size:
            problems.append(f"{rel} is {size} bytes, the manifest says {entry.size}")
    return problems


def write_file_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a hidden temporary sibling, fsync it and move it into place."""
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_dir_manifest(root: Path, manifest: DirManifest) -> None:
    """Write ``root/dockflow-manifest.json`` atomically."""
    write_file_atomic(root / DIR_MANIFEST, manifest.to_json().encode("utf-8"))
