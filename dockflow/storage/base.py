"""The checkpoint store interface that every backend (local directory, S3/MinIO) implements.

Protocol, for one checkpoint of step ``s``:

1. every writer (the driver, or several Ray actors, each in its own process) calls
   ``store.write_part(s, name, obj)`` for its own part name;
2. one process calls ``store.commit(s, meta, parts=[...])``: it checks that the parts are complete and writes
   the manifest LAST; only a checkpoint with a manifest exists for ``latest``/``read_*``; then retention
   deletes old checkpoints;
3. on resume: ``step = store.latest()`` then ``store.read_part(step, name)`` and ``store.read_meta(step)``.

The interface never needs a rename of a folder, so object stores implement it with plain puts.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any

from dockflow.storage.manifest import CheckpointError, Manifest, PartInfo, step_dirname

log = logging.getLogger(__name__)


class CheckpointStore(ABC):
    """Write parts, commit them with a manifest, find the latest valid checkpoint, read it back."""

    def __init__(self, keep: int) -> None:
        if keep < 1:
            raise CheckpointError(f"checkpoint keep must be >= 1, got {keep}: set checkpoint.keep")
        self.keep = keep

    @abstractmethod
    def write_part(self, step: int, name: str, obj: Any) -> PartInfo:
        """``torch.save`` ``obj`` as part ``name`` of step ``step`` (streamed; the part becomes visible whole)."""

    @abstractmethod
    def commit(self, step: int, meta: dict[str, Any], parts: list[str] | None = None) -> Manifest:
        """Check the parts (all of ``parts`` if given, else whatever was written), write the manifest last,
        then apply retention. Raises CheckpointError naming any missing or incomplete part."""

    @abstractmethod
    def read_part(self, step: int, name: str, *, map_location: str = "cpu", weights_only: bool = True) -> Any:
        """Load a part of a committed checkpoint after checking its size and sha256.

        ``weights_only=False`` is needed for objects such as numpy RNG states."""

    @abstractmethod
    def read_manifest(self, step: int) -> Manifest:
        """The manifest of a committed checkpoint (CheckpointError if there is none)."""

    @abstractmethod
    def list_steps(self) -> list[int]:
        """Committed steps (manifest present), ascending; parts are not verified here."""

    @abstractmethod
    def list_uncommitted(self) -> list[int]:
        """Steps that have parts but no manifest (in progress, or interrupted before commit), ascending."""

    @abstractmethod
    def verify(self, step: int) -> Manifest:
        """Check every part of a committed checkpoint against its manifest (size and sha256)."""

    @abstractmethod
    def delete(self, step: int) -> None:
        """Delete a checkpoint, manifest first, so a half-done delete leaves an uncommitted one."""

    @abstractmethod
    def location(self, step: int | None = None) -> str:
        """Human-readable place of a step's checkpoint (None: of the whole store), for messages."""

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

    def _retain(self, committed_step: int) -> None:
        """Keep the ``keep`` newest committed checkpoints (always ``committed_step``) and delete uncommitted
        ones older than the newest commit. Failures are warnings: the commit itself already succeeded."""
        committed = self.list_steps()
        keep = set(sorted(committed, reverse=True)[: self.keep]) | {committed_step}
        doomed = [s for s in committed if s not in keep]
        newest = max(committed, default=committed_step)
        doomed += [s for s in self.list_uncommitted() if s < newest]
        for step in doomed:
            try:
                self.delete(step)
            except (OSError, CheckpointError) as exc:
                log.warning("could not delete old checkpoint %s: %s", self.location(step), exc)
