"""One line for a write that failed: a full disk (``ENOSPC``), an exhausted quota (``EDQUOT``) or a file-size limit
(``EFBIG``, ``ulimit -f``) is named as such, with the path and what to do.

Every write of a checkpoint goes to a temporary name in the new step's folder and is moved into place whole, and
the manifest is written last, so a failed write leaves the checkpoints already committed as they were: the
message says so.
"""

from __future__ import annotations

import errno
from pathlib import Path

from dockflow.storage.manifest import CheckpointError

#: The errors of a write that more room would fix, and how each is worded.
NO_ROOM = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EFBIG: "the file-size limit is reached (ulimit -f)",
}


def no_room(exc: BaseException) -> str | None:
    """How ``exc`` says the disk is full (None: it is another error)."""
    return NO_ROOM.get(exc.errno) if isinstance(exc, OSError) else None


def write_failed(what: str, path: str | Path, exc: OSError, root: str | Path) -> CheckpointError:
    """The one-line error of a failed write of ``what`` at ``path`` under the store's ``root``."""
    reason = no_room(exc)
    if reason is None:
        return CheckpointError(f"cannot write {what} {path} ({exc}): check free space and permissions of {root}")
    code = errno.errorcode.get(exc.errno or 0, "?")
    return CheckpointError(
        f"cannot write {what} {path}: {reason} ({code}): free space under {root} or set checkpoint.dir to a volume "
        "with room; the checkpoints committed before are intact (resume from them with --resume)"
    )


def no_room_line(exc: BaseException) -> str | None:
    """One line for an ``OSError`` of a full disk raised outside the checkpoint store (a run's directory, a cache),
    naming the file when the error does; None for any other error."""
    reason = no_room(exc)
    if reason is None:
        return None
    where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
    code = errno.errorcode.get(exc.errno or 0, "?")
    return f"cannot write{where}: {reason} ({code}): free space there, or point the run's directories elsewhere"
