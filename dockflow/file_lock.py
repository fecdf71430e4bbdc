"""An exclusive ``flock`` on a file, for processes of one node that must take turns: builders of one cache entry
(``dockflow.storage.cache``), runs that create one SQLite tracking store (``dockflow.tracking.mlflow_tracker``).

    with exclusive_lock(root / ".entry.lock", "concurrent fetches on this node may download twice") as held:
        ...
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


@contextlib.contextmanager
def exclusive_lock(path: Path, without: str, timeout_s: float | None = None,
                   held_by: str = "another process") -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing; never deleted, so nobody locks a stale inode);
    yields whether the lock is held. Where the file system has no locks, go on without it, warning ``without``
    (what may then go wrong). With ``timeout_s``, a lock still held after that long raises ``TimeoutError`` naming
    ``path`` and ``held_by``; without, wait as long as the holder lives (the kernel drops a dead holder's lock)."""
    with open(path, "a+b") as f:
        held = _take(f.fileno(), path, without, timeout_s, held_by)
        try:
            yield held
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _take(fd: int, path: Path, without: str, timeout_s: float | None, held_by: str) -> bool:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if deadline is None else fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:  # LOCK_NB: someone holds it
            if time.monotonic() >= deadline:
                raise TimeoutError(f"waited {timeout_s:g} s for the lock {path}: {held_by} still holds it") from None
            time.sleep(0.05)
        except OSError as exc:
            log.warning("no lock on %s (%s): %s", path, exc, without)
            return False
