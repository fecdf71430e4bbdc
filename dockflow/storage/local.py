"""Checkpoint store on a local (or shared POSIX) directory.

    store = LocalCheckpointStore("runs/x/checkpoints", keep=2)
    store.write_part(10, "actor", model.state_dict())      # any process on this machine, one name each
    store.commit(10, {"iteration": 10}, parts=["actor"])    # one process, after all writers are done
    step = store.latest()                                   # 10
    state = store.read_part(step, "actor")

Each file is written to a hidden temporary name in ``<root>/step-000010/``, fsynced and moved into place with
``os.replace``, so readers never see half a file and several processes can write parts of the same step.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

from dockflow.storage.base import CheckpointStore
from dockflow.storage.manifest import (
    MANIFEST_NAME,
    PART_SUFFIX,
    RECORD_SUFFIX,
    CheckpointError,
    HashingWriter,
    Manifest,
    PartInfo,
    check_part_name,
    meta_json_check,
    parse_record,
    parse_step_dirname,
    part_filename,
    record_filename,
    record_json,
    sha256_file,
    step_dirname,
)


def _fsync_dir(path: Path) -> None:
    # Makes the os.replace itself durable (the new directory entry), not only the file's bytes.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tmp_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _write_text_atomic(final: Path, text: str) -> None:
    tmp = _tmp_name(final)
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


class LocalCheckpointStore(CheckpointStore):
    """Checkpoints as ``<root>/step-NNNNNN/`` folders; see the module docstring."""

    def __init__(self, root: str | Path, keep: int) -> None:
        super().__init__(keep)
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(
                f"cannot create checkpoint directory '{self.root}' ({exc}): set checkpoint.dir to a writable directory"
            ) from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise CheckpointError(
                f"checkpoint directory '{self.root}' is not writable: fix its permissions or set checkpoint.dir"
            )

    def location(self, step: int | None = None) -> str:
        return str(self.root if step is None else self._dir(step))

    def _dir(self, step: int) -> Path:
        return self.root / step_dirname(step)

    def write_part(self, step: int, name: str, obj: Any) -> PartInfo:
        check_part_name(name)
        d = self._dir(step)
        if (d / MANIFEST_NAME).exists():
            raise CheckpointError(
                f"checkpoint {d} is already committed: write to a new step, or delete this one first"
            )
        final = d / part_filename(name)
        tmp = _tmp_name(final)
        try:
            d.mkdir(parents=True, exist_ok=True)
            with open(tmp, "xb") as f:
                w = HashingWriter(f)
                torch.save(obj, w)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            info = PartInfo(name=name, size=w.size, sha256=w.sha256)
            _write_text_atomic(d / record_filename(name), record_json(info))
            _fsync_dir(d)
        except OSError as exc:
            raise CheckpointError(
                f"cannot write checkpoint part {final} ({exc}): check free space and permissions of {self.root}"
            ) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return info

    def _written_parts(self, d: Path) -> dict[str, PartInfo]:
        parts: dict[str, PartInfo] = {}
        for rec in sorted(d.glob("*" + RECORD_SUFFIX)):
            if rec.name.startswith("."):
                continue
            name = rec.name[: -len(RECORD_SUFFIX)]
            info = parse_record(rec.read_text(encoding="utf-8"), name, str(rec))
            part = d / part_filename(name)
            size = part.stat().st_size if part.exists() else None
            if size != info.size:
                raise CheckpointError(
                    f"checkpoint part {part} is {'missing' if size is None else f'{size} bytes'} but its record "
                    f"says {info.size} bytes: write part '{name}' of this step again"
                )
            parts[name] = info
        return parts

    def commit(self, step: int, meta: dict[str, Any], parts: list[str] | None = None) -> Manifest:
        meta_json_check(meta)
        d = self._dir(step)
        if (d / MANIFEST_NAME).exists():
            raise CheckpointError(f"checkpoint {d} is already committed")
        if not d.is_dir():
            raise CheckpointError(f"no parts were written for step {step} (no directory {d}): call write_part first")
        written = self._written_parts(d)
        expected = parts if parts is not None else sorted(written)
        # A part file without its record: the writer died between the two, so the part cannot be trusted.
        unrecorded = sorted(
            p.name[: -len(PART_SUFFIX)] for p in d.glob("*" + PART_SUFFIX) if not p.name.startswith(".")
        )
        unfinished = [n for n in unrecorded if n not in written and (parts is None or n in parts)]
        if unfinished:
            raise CheckpointError(
                f"cannot commit {d}: parts {unfinished} have no record (their writers did not finish); "
                "write them again"
            )
        missing = [n for n in expected if n not in written]
        if missing:
            raise CheckpointError(
                f"cannot commit {d}: parts {missing} were not written (found {sorted(written)}); "
                "wait for their writers to finish, or check those writers' errors"
            )
        if not expected:
            raise CheckpointError(f"cannot commit {d}: it holds no parts; call write_part first")
        manifest = Manifest(step=step, meta=meta, parts=written)
        try:
            _write_text_atomic(d / MANIFEST_NAME, manifest.to_json())
            _fsync_dir(d)
        except OSError as exc:
            raise CheckpointError(f"cannot write manifest in {d} ({exc}): check free space and permissions") from None
        self._retain(step)
        return manifest

    def read_manifest(self, step: int) -> Manifest:
        path = self._dir(step) / MANIFEST_NAME
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CheckpointError(
                f"checkpoint {self._dir(step)} is not committed (no {MANIFEST_NAME}); committed steps: {self.list_steps()}"
            ) from None
        manifest = Manifest.from_json(text, str(path))
        if manifest.step != step:
            raise CheckpointError(f"manifest {path} is for step {manifest.step}, not {step}: delete that checkpoint")
        return manifest

    def _check_part(self, step: int, info: PartInfo) -> Path:
        path = self._dir(step) / part_filename(info.name)
        if not path.is_file():
            raise CheckpointError(f"checkpoint part {path} is missing: that checkpoint is broken, resume from another")
        size, digest = sha256_file(path)
        if size != info.size or digest != info.sha256:
            raise CheckpointError(
                f"checkpoint part {path} is corrupt (size {size} vs {info.size} in manifest, sha256 "
                f"{'matches' if digest == info.sha256 else 'differs'}): resume from another checkpoint"
            )
        return path

    def verify(self, step: int) -> Manifest:
        manifest = self.read_manifest(step)
        for info in manifest.parts.values():
            self._check_part(step, info)
        return manifest

    def read_part(self, step: int, name: str, *, map_location: str = "cpu", weights_only: bool = True) -> Any:
        manifest = self.read_manifest(step)
        if name not in manifest.parts:
            raise CheckpointError(
                f"checkpoint {self._dir(step)} has no part '{name}'; it has {sorted(manifest.parts)}"
            )
        path = self._check_part(step, manifest.parts[name])
        return torch.load(path, map_location=map_location, weights_only=weights_only)

    def _step_dirs(self) -> list[tuple[int, Path]]:
        out = []
        for p in self.root.iterdir():
            step = parse_step_dirname(p.name)
            if step is not None and p.is_dir():
                out.append((step, p))
        return sorted(out)

    def list_steps(self) -> list[int]:
        return [s for s, p in self._step_dirs() if (p / MANIFEST_NAME).exists()]

    def list_uncommitted(self) -> list[int]:
        return [s for s, p in self._step_dirs() if not (p / MANIFEST_NAME).exists()]

    def delete(self, step: int) -> None:
        d = self._dir(step)
        with contextlib.suppress(FileNotFoundError):
            (d / MANIFEST_NAME).unlink()
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(d)
