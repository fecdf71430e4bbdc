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
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from dockflow.storage.checkpoint_store import CheckpointStore, Fetched
from dockflow.storage.fault_points import pause_point
from dockflow.storage.manifest import (
    MANIFEST_NAME,
    CheckpointError,
    HashingWriter,
    PartInfo,
    parse_step_dirname,
    part_filename,
    sha256_file,
    step_dirname,
)
from dockflow.storage.write_errors import write_failed


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

    def __init__(
        self,
        root: str | Path,
        keep: int,
        best_metric: str | None = None,
        best_mode: Literal["max", "min"] = "max",
    ) -> None:
        super().__init__(keep, best_metric, best_mode)
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

    def __repr__(self) -> str:
        return f"LocalCheckpointStore({str(self.root)!r}, keep={self.keep})"

    def location(self, step: int | None = None) -> str:
        return str(self.root if step is None else self._dir(step))

    def _dir(self, step: int) -> Path:
        return self.root / step_dirname(step)

    def _save_part(self, step: int, name: str, obj: Any) -> PartInfo:
        d = self._dir(step)
        final = d / part_filename(name)
        tmp = _tmp_name(final)
        try:
            d.mkdir(parents=True, exist_ok=True)
            with open(tmp, "xb") as f:
                w = HashingWriter(f)
                self._encode(obj, w)
                f.flush()
                pause_point(f"save.{step}.{name}")
                os.fsync(f.fileno())
            os.replace(tmp, final)  # made durable by the directory fsync after the part's record
        except OSError as exc:
            raise write_failed("checkpoint part", final, exc, self.root) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return PartInfo(name=name, size=w.size, sha256=w.sha256)

    def _put_text(self, step: int, filename: str, text: str) -> None:
        d = self._dir(step)
        try:
            d.mkdir(parents=True, exist_ok=True)
            _write_text_atomic(d / filename, text)
            _fsync_dir(d)
        except OSError as exc:
            raise write_failed("checkpoint file", d / filename, exc, self.root) from None

    def _get_text(self, step: int, filename: str) -> str | None:
        try:
            return (self._dir(step) / filename).read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _list_files(self, step: int) -> dict[str, int]:
        d = self._dir(step)
        if not d.is_dir():
            return {}
        return {p.name: p.stat().st_size for p in d.iterdir() if not p.name.startswith(".") and p.is_file()}

    def _list_all(self) -> dict[int, bool]:
        out = {}
        for p in self.root.iterdir():
            step = parse_step_dirname(p.name)
            if step is not None and p.is_dir():
                out[step] = (p / MANIFEST_NAME).exists()
        return out

    @contextlib.contextmanager
    def _fetch(self, step: int, filename: str, keep_data: bool) -> Iterator[Fetched]:
        path = self._dir(step) / filename
        yield (path, *sha256_file(path)) if path.is_file() else None

    def delete(self, step: int) -> None:
        d = self._dir(step)
        with contextlib.suppress(FileNotFoundError):
            (d / MANIFEST_NAME).unlink()
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(d)
