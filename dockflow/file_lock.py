"""An exclusive ``flock`` on a file, for processes of one node that must take turns: builders of one cache entry
(``dockflow.storage.cache``), runs that create one SQLite tracking store (``dockflow.tracking.mlflow_tracker``).

    with exclusive_lock(root / ".entry.lock", "concurrent fetches on this node may download twice") as held:
        ...
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


@contextlib.contextmanager
def exclusive_lock(path: Path, without: str) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing; never deleted, so nobody locks a stale inode);
    yields whether the lock is held. Where the file system has no locks, go on without it, warning ``without``
    (what may then go wrong)."""
    with open(path, "a+b") as f:
        held = True
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        except OSError as exc:
            held = False
            log.warning("no lock on %s (%s): %s", path, exc, without)
        try:
            yield held
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
