"""The per-node cache of fetched models and input files: complete entries only, one download per node.

    root = cache_root(None)                 # $DOCKFLOW_CACHE_DIR, else ~/.cache/dockflow
    path = cached_entry(root / "models", name, is_complete, build)

An entry is a directory ``<root>/<name>``. It is built by ``build(tmp)`` in a hidden temporary sibling and
renamed into place, so a crash never leaves a half entry under the final name. Builders of one entry take
turns through an exclusive ``flock`` on ``<root>/.<name>.lock``: of several processes (or threads) on one node
that fetch the same model at once, one downloads and the others wait, then reuse its entry.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from dockflow.file_lock import exclusive_lock
from dockflow.storage.manifest import CheckpointError
from dockflow.storage.write_errors import no_room

log = logging.getLogger(__name__)

ENV_CACHE_DIR = "DOCKFLOW_CACHE_DIR"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir``, else ``$DOCKFLOW_CACHE_DIR``, else ``~/.cache/dockflow``."""
    chosen = cache_dir or os.environ.get(ENV_CACHE_DIR) or Path.home() / ".cache" / "dockflow"
    return Path(chosen).expanduser()


def entry_name(label: str, *keys: str) -> str:
    """A readable, file-system-safe entry name: ``label`` (sanitized, at most 40 chars) and the given keys."""
    safe = _UNSAFE.sub("_", label).strip("._")[:40] or "x"
    return "-".join([safe, *keys])


def _remove(path: Path) -> None:
    """Delete a directory without leaving it half-deleted under its own name."""
    if not path.exists():
        return
    aside = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
    os.replace(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


def cached_entry(
    root: Path, name: str, is_complete: Callable[[Path], bool], build: Callable[[Path], None]
) -> Path:
    """``root/name``, built by ``build(tmp_dir)`` unless a complete entry (``is_complete``) is already there.

    Raises CheckpointError when the cache directory cannot be written; errors of ``build`` propagate, and
    leave nothing under ``root/name``."""
    final = root / name
    if final.is_dir() and is_complete(final):
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(root / f".{name}.lock", "concurrent fetches on this node may download twice") as held:
            if final.is_dir():
                if is_complete(final):  # another process built it while we waited
                    return final
                log.warning("cached copy %s is incomplete or damaged: fetching it again", final)
                _remove(final)
            # Left by a crashed builder. Only under the lock: without it, a sibling may be building there now.
            for stale in root.glob(f".{name}.tmp-*") if held else ():
                shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
            try:
                build(tmp)
                try:
                    os.rename(tmp, final)
                except OSError:  # only without a working lock: another builder won the race
                    if not (final.is_dir() and is_complete(final)):
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        raise CheckpointError(
            f"cannot write the fetch cache {root} ({no_room(exc) or f'{type(exc).__name__}: {exc}'}): set {ENV_CACHE_DIR} to a "
            "writable directory with room for the model and data (each node has its own)"
        ) from None
    return final
