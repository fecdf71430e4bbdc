"""Test hooks: hold a process at a named point of the checkpoint protocol, so that a test can SIGKILL it there.

Off unless ``DOCKFLOW_FAULT_DIR`` names a directory (then each point costs one ``rename`` attempt). A test arms a
point by creating the empty file ``<dir>/<point>``; the points are

- ``save.<step>.<part>``: inside ``write_part``, the part's bytes are written to its temporary file (local) or
  staging buffer (S3) and not yet moved into place or uploaded, its record not written;
- ``commit.<step>``: inside ``commit``, every part is checked and the manifest is not yet written.

The first process to reach an armed point takes it (renames the file: one process wins), writes its pid to
``<dir>/<point>.pid`` and waits there for ``FAULT_WAIT_S`` at most, then fails with one line (the test did not
kill it). Used by ``tests/integration/test_outages.py`` to land a real SIGKILL of a real worker or driver inside
a save or a commit; never set in a run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dockflow.storage.manifest import CheckpointError

FAULT_DIR_ENV = "DOCKFLOW_FAULT_DIR"
FAULT_WAIT_S = 120.0


def pause_point(point: str) -> None:
    """Wait here to be killed when ``point`` is armed (see the module docstring); return at once otherwise."""
    root = os.environ.get(FAULT_DIR_ENV)
    if not root:
        return
    armed = Path(root) / point
    try:
        os.rename(armed, armed.with_name(f"{point}.taken"))
    except FileNotFoundError:
        return
    pid_file = armed.with_name(f"{point}.pid")
    tmp = armed.with_name(f".{point}.pid.tmp-{os.getpid()}")
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, pid_file)  # the test reads a whole pid
    time.sleep(FAULT_WAIT_S)
    raise CheckpointError(
        f"fault point {point} (armed in {root}, {FAULT_DIR_ENV}) was not killed within {FAULT_WAIT_S:.0f} s"
    )
