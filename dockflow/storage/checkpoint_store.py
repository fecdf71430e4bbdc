"""The checkpoint store interface that every backend (local directory, S3/MinIO) implements.

Protocol, for one checkpoint of step ``s``:

1. every writer (the driver, or several Ray actors, each in its own process) calls
   ``store.write_part(s, name, obj)`` for its own part name;
2. one process calls ``store.commit(s, meta, parts=[...])``: it checks that the parts are complete and writes
   the manifest LAST; only a checkpoint with a manifest exists for ``latest``/``read_*``; then retention
   deletes old checkpoints (keeping the last ``keep`` and, optionally, the best by a metric of ``meta``);
3. on resume: ``step = store.latest()`` then ``store.read_part(step, name)`` and ``store.read_meta(step)``.

Parts are data only (``dockflow.storage.part_format``): reading one parses JSON and tensor bytes, never a pickle.
The manifest records each part's size and sha256; with a checkpoint key (``dockflow.storage.signing``) it is
signed too, and the signature is checked before any part is read. Without a key the sha256 only catches
corruption: whoever can write the bucket can rewrite a part and its manifest alike.

The interface never needs a rename of a folder, so object stores implement it with plain puts. The protocol
itself (commit checks, manifest, verification, retention) lives here; a backend only provides a few
primitives on the files of one step: save a part, put/get a small text file, list files, fetch a file with
its size and sha256, delete a step.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any, BinaryIO, Literal

from dockflow.storage.fault_points import pause_point
from dockflow.storage.manifest import (
    MANIFEST_NAME,
    PART_SUFFIX,
    RECORD_SUFFIX,
    CheckpointError,
    Manifest,
    OldCheckpointError,
    PartInfo,
    check_part_name,
    meta_json_check,
    parse_record,
    part_filename,
    record_filename,
    record_json,
    step_dirname,
)
from dockflow.storage.part_format import read_part_file, write_part_file
from dockflow.storage.signing import checkpoint_key

log = logging.getLogger(__name__)

#: What ``_fetch`` yields: a readable source for ``read_part_file`` (a path or an open binary file), the bytes'
#: size and their sha256; None when the file is missing.
Fetched = tuple[Any, int, str] | None


class CheckpointStore(ABC):
    """Write parts, commit them with a manifest, find the latest valid checkpoint, read it back.

    ``keep``: how many of the newest committed checkpoints retention keeps. ``best_metric``: a key of the
    commit ``meta``; when set, the committed checkpoint with the best numeric value of it (``best_mode``
    ``max`` or ``min``; ties go to the newer step) is kept as well.
    """

    def __init__(
        self, keep: int, best_metric: str | None = None, best_mode: Literal["max", "min"] = "max"
    ) -> None:
        if keep < 1:
            raise CheckpointError(f"checkpoint keep must be >= 1, got {keep}: set checkpoint.keep")
        if best_mode not in ("max", "min"):
            raise CheckpointError(f"checkpoint best_mode must be 'max' or 'min', got {best_mode!r}")
        self.keep = keep
        self.best_metric = best_metric
        self.best_mode = best_mode

    # ---- backend primitives: all names are file names inside the folder/prefix of one step ----

    @abstractmethod
    def location(self, step: int | None = None) -> str:
        """Human-readable place of a step's checkpoint (None: of the whole store), for messages."""

    @abstractmethod
    def _save_part(self, step: int, name: str, obj: Any) -> PartInfo:
        """Stream ``obj`` (``self._encode``) into ``part_filename(name)`` of ``step``; it becomes visible whole."""

    @abstractmethod
    def _put_text(self, step: int, filename: str, text: str) -> None:
        """Write a small UTF-8 file of ``step`` so that it becomes visible whole."""

    @abstractmethod
    def _get_text(self, step: int, filename: str) -> str | None:
        """A small UTF-8 file of ``step``; None when it does not exist."""

    @abstractmethod
    def _list_files(self, step: int) -> dict[str, int]:
        """Visible files of ``step`` (no temporaries) and their sizes; empty when the step has none."""

    @abstractmethod
    def _list_all(self) -> dict[int, bool]:
        """Every step that has files, and whether it is committed (its manifest exists)."""

    @abstractmethod
    def _fetch(self, step: int, filename: str, keep_data: bool) -> AbstractContextManager[Fetched]:
        """Context manager yielding ``(source, size, sha256)`` of a file of ``step``, or None if missing.

        With ``keep_data`` the source must stay readable by ``read_part_file`` inside the context (a local
        path, or a temporary copy of a remote object); without it only size and digest are needed."""

    @abstractmethod
    def delete(self, step: int) -> None:
        """Delete a checkpoint, manifest first, so a half-done delete leaves an uncommitted one."""

    # ---- the protocol, shared by every backend ----

    @staticmethod
    def _encode(obj: Any, f: BinaryIO) -> None:
        """Write ``obj`` as a data-only part into ``f`` (what every backend's ``_save_part`` streams)."""
        write_part_file(obj, f)

    def write_part(self, step: int, name: str, obj: Any) -> PartInfo:
        """Save ``obj`` as part ``name`` of step ``step`` (data only: ``dockflow.storage.part_format``; streamed,
        the part becomes visible whole), then write the part's record (size + sha256)."""
        check_part_name(name)
        if self._get_text(step, MANIFEST_NAME) is not None:
            raise CheckpointError(
                f"checkpoint {self.location(step)} is already committed: write to a new step, or delete this one first"
            )
        info = self._save_part(step, name, obj)
        self._put_text(step, record_filename(name), record_json(info))
        return info

    def _recorded_parts(self, step: int, files: dict[str, int]) -> dict[str, PartInfo]:
        """Parts of ``step`` that have a record and whose size matches it."""
        where = self.location(step)
        parts: dict[str, PartInfo] = {}
        for fname in sorted(files):
            if not fname.endswith(RECORD_SUFFIX):
                continue
            name = fname[: -len(RECORD_SUFFIX)]
            text = self._get_text(step, fname)
            if text is None:  # deleted since the listing: treated like a part without record
                continue
            info = parse_record(text, name, f"{where}/{fname}")
            size = files.get(part_filename(name))
            if size != info.size:
                raise CheckpointError(
                    f"checkpoint part {where}/{part_filename(name)} is "
                    f"{'missing' if size is None else f'{size} bytes'} but its record says {info.size} bytes: "
                    f"write part '{name}' of this step again"
                )
            parts[name] = info
        return parts

    def commit(self, step: int, meta: dict[str, Any], parts: list[str] | None = None) -> Manifest:
        """Check the parts (all of ``parts`` if given, else whatever was written), write the manifest last,
        then apply retention. Raises CheckpointError naming any missing or incomplete part."""
        meta_json_check(meta)
        where = self.location(step)
        if self._get_text(step, MANIFEST_NAME) is not None:
            raise CheckpointError(f"checkpoint {where} is already committed")
        files = self._list_files(step)
        if not files:
            raise CheckpointError(f"no parts were written for step {step} (nothing at {where}): call write_part first")
        written = self._recorded_parts(step, files)
        expected = parts if parts is not None else sorted(written)
        # A part file without its record: the writer died between the two, so the part cannot be trusted.
        unrecorded = sorted(f[: -len(PART_SUFFIX)] for f in files if f.endswith(PART_SUFFIX))
        unfinished = [n for n in unrecorded if n not in written and (parts is None or n in parts)]
        if unfinished:
            raise CheckpointError(
                f"cannot commit {where}: parts {unfinished} have no record (their writers did not finish); "
                "write them again"
            )
        missing = [n for n in expected if n not in written]
        if missing:
            raise CheckpointError(
                f"cannot commit {where}: parts {missing} were not written (found {sorted(written)}); "
                "wait for their writers to finish, or check those writers' errors"
            )
        if not expected:
            raise CheckpointError(f"cannot commit {where}: it holds no parts; call write_part first")
        manifest = Manifest(step=step, meta=meta, parts=written)
        pause_point(f"commit.{step}")
        self._put_text(step, MANIFEST_NAME, manifest.to_json(checkpoint_key()))
        self._retain(step, meta)
        return manifest

    def read_manifest(self, step: int) -> Manifest:
        """The manifest of a committed checkpoint (CheckpointError if there is none, or if a checkpoint key is
        set and the manifest's signature does not match it)."""
        where = self.location(step)
        text = self._get_text(step, MANIFEST_NAME)
        if text is None:
            raise CheckpointError(
                f"checkpoint {where} is not committed (no {MANIFEST_NAME}); committed steps: {self.list_steps()}"
            )
        manifest = Manifest.from_json(text, f"{where}/{MANIFEST_NAME}", checkpoint_key())
        if manifest.step != step:
            raise CheckpointError(
                f"manifest {where}/{MANIFEST_NAME} is for step {manifest.step}, not {step}: delete that checkpoint"
            )
        return manifest

    def _check_fetched(self, step: int, info: PartInfo, got: Fetched) -> Any:
        """The source of a fetched part after checking its size and sha256 against ``info``."""
        path = f"{self.location(step)}/{part_filename(info.name)}"
        if got is None:
            raise CheckpointError(f"checkpoint part {path} is missing: that checkpoint is broken, resume from another")
        source, size, digest = got
        if size != info.size or digest != info.sha256:
            raise CheckpointError(
                f"checkpoint part {path} is corrupt (size {size} vs {info.size} in manifest, sha256 "
                f"{'matches' if digest == info.sha256 else 'differs'}): resume from another checkpoint"
            )
        return source

    def verify(self, step: int) -> Manifest:
        """Check every part of a committed checkpoint against its manifest (size and sha256)."""
        manifest = self.read_manifest(step)
        for info in manifest.parts.values():
            with self._fetch(step, part_filename(info.name), keep_data=False) as got:
                self._check_fetched(step, info, got)
        return manifest

    def read_part(self, step: int, name: str, *, types: Iterable[type] = ()) -> Any:
        """Read a part of a committed checkpoint after checking the manifest (its signature, with a key) and the
        part's size and sha256. Data only: ``types`` are the dataclasses the part may hold (any other class is
        refused; ``dockflow.storage.part_format``)."""
        manifest = self.read_manifest(step)
        if name not in manifest.parts:
            raise CheckpointError(
                f"checkpoint {self.location(step)} has no part '{name}'; it has {sorted(manifest.parts)}"
            )
        with self._fetch(step, part_filename(name), keep_data=True) as got:
            source = self._check_fetched(step, manifest.parts[name], got)
            return read_part_file(source, f"{self.location(step)}/{part_filename(name)}", types)

    def list_steps(self) -> list[int]:
        """Committed steps (manifest present), ascending; parts are not verified here."""
        return sorted(s for s, committed in self._list_all().items() if committed)

    def list_uncommitted(self) -> list[int]:
        """Steps that have parts but no manifest (in progress, or interrupted before commit), ascending."""
        return sorted(s for s, committed in self._list_all().items() if not committed)

    def read_meta(self, step: int) -> dict[str, Any]:
        """The ``meta`` dict given to ``commit``."""
        return self.read_manifest(step).meta

    def list_parts(self, step: int) -> list[str]:
        """Part names of a committed checkpoint."""
        return sorted(self.read_manifest(step).parts)

    def latest(self, verify: bool = True) -> int | None:
        """Highest committed step whose parts match its manifest; invalid or uncommitted ones are skipped
        with a warning. ``verify=False`` skips the checksums (manifest presence only)."""
        found: int | None = None
        for step in reversed(self.list_steps()):
            if not verify:
                found = step
                break
            try:
                self.verify(step)
            except OldCheckpointError:
                raise  # never skipped: the run would silently start over next to it
            except CheckpointError as exc:
                log.warning("ignoring checkpoint %s: %s", step_dirname(step), exc)
                continue
            found = step
            break
        for step in self.list_uncommitted():
            if found is None or step > found:
                log.warning(
                    "ignoring checkpoint %s at %s: it has parts but no manifest (interrupted before commit)",
                    step_dirname(step),
                    self.location(step),
                )
        return found

    def best_step(self, steps: list[int] | None = None) -> int | None:
        """The committed step with the best ``best_metric`` in its meta (None: no metric set, or no step
        has a finite number under it). Ties go to the newer step."""
        if self.best_metric is None:
            return None
        best: tuple[float, int] | None = None
        sign = 1.0 if self.best_mode == "max" else -1.0
        for step in self.list_steps() if steps is None else steps:
            try:
                value = self.read_meta(step).get(self.best_metric)
            except CheckpointError as exc:
                log.warning("checkpoint %s is not a candidate for the best one: %s", step_dirname(step), exc)
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            if best is None or (sign * value, step) >= best:
                best = (sign * value, step)
        return None if best is None else best[1]

    def _retain(self, committed_step: int, meta: dict[str, Any] | None = None) -> None:
        """Keep the ``keep`` newest committed checkpoints (always ``committed_step``) and the best one by
        ``best_metric`` if set, and delete uncommitted ones older than the newest commit. Failures are
        warnings: the commit itself already succeeded."""
        committed = self.list_steps()
        keep = set(sorted(committed, reverse=True)[: self.keep]) | {committed_step}
        if self.best_metric is not None:
            best = self.best_step(committed)
            if best is None:
                log.warning(
                    "checkpoint.best_metric %r is not a number in the meta of any committed checkpoint under %s "
                    "(the meta just committed has keys %s): keeping only the last %d",
                    self.best_metric,
                    self.location(),
                    sorted(meta or {}),
                    self.keep,
                )
            else:
                keep.add(best)
        doomed = [s for s in committed if s not in keep]
        newest = max(committed, default=committed_step)
        doomed += [s for s in self.list_uncommitted() if s < newest]
        for step in doomed:
            try:
                self.delete(step)
            except (OSError, CheckpointError) as exc:
                log.warning("could not delete old checkpoint %s: %s", self.location(step), exc)

