"""A worker that fails in its constructor reads as one line: its own exception, not Ray's traceback of it."""

from __future__ import annotations

import pytest
import ray

from dockflow.storage.manifest import CheckpointError
from dockflow.workers.startup import start_error

TRACEBACK = "Traceback (most recent call last):\n  File \"worker.py\", line 9, in __init__\n    load()\n{last}"


@pytest.mark.parametrize(("cause", "last", "line"), [
    (CheckpointError("model directory '/m' does not exist: set model.path"),
     "dockflow.storage.manifest.CheckpointError: model directory '/m' does not exist: set model.path",
     "model directory '/m' does not exist: set model.path"),
    (ValueError("bad\nshape"), "ValueError: bad", "ValueError: bad shape"),
])
def test_a_constructor_error_is_one_line(cause: Exception, last: str, line: str) -> None:
    task_error = ray.exceptions.RayTaskError("ActorWorker.__init__", TRACEBACK.format(last=last), cause)
    assert start_error(task_error) == line
    died = ray.exceptions.ActorDiedError(task_error)  # what a call on the actor raises
    assert died.actor_init_failed and "\n" in str(died)
    assert start_error(died) == line.replace(" shape", "")  # the traceback's last line
