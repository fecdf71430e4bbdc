"""A write that fails for want of room is named as such, in one line with the path; other errors keep theirs.
(The real thing, a worker's save under a file-size limit, is ``tests/integration/test_outages.py``.)"""

from __future__ import annotations

import errno
import os

import pytest

from dockflow.storage import LocalCheckpointStore
from dockflow.storage.fault_points import FAULT_DIR_ENV, pause_point
from dockflow.storage.write_errors import write_failed


@pytest.mark.parametrize(
    ("code", "reason"),
    [(errno.ENOSPC, "no space left on the device (ENOSPC)"), (errno.EDQUOT, "the disk quota is exhausted (EDQUOT)"),
     (errno.EFBIG, "the file-size limit is reached (ulimit -f) (EFBIG)")],
)
def test_no_room_is_named_with_the_path(code: int, reason: str) -> None:
    err = write_failed("checkpoint part", "/ckpt/run/step-000002/actor.safetensors", OSError(code, os.strerror(code)),
                       "/ckpt/run")
    assert str(err) == (f"cannot write checkpoint part /ckpt/run/step-000002/actor.safetensors: {reason}: free space "
                        "under /ckpt/run or set checkpoint.dir to a volume with room; the checkpoints committed before "
                        "are intact (resume from them with --resume)")


def test_other_errors_keep_their_reason() -> None:
    err = write_failed("checkpoint file", "/ckpt/x", PermissionError(errno.EACCES, "Permission denied"), "/ckpt")
    assert str(err) == "cannot write checkpoint file /ckpt/x ([Errno 13] Permission denied): check free space and " \
                       "permissions of /ckpt"


def test_fault_points_are_off_unless_armed(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(FAULT_DIR_ENV, raising=False)
    pause_point("commit.1")  # returns at once
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path))
    store = LocalCheckpointStore(tmp_path / "ckpt", keep=2)
    store.write_part(1, "actor", {"x": 1})
    store.commit(1, {})  # nothing armed: nothing waits
    assert store.latest() == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_the_cli_prints_one_line_for_a_full_disk_anywhere(monkeypatch, capsys) -> None:
    """An ENOSPC raised outside the store (the run's directory, a cache) is one line naming the file, exit 2."""
    import dockflow.cli as cli

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/runs/x/summary.json")

    monkeypatch.setattr(cli, "_cmd_train", full)
    assert cli.main(["train", "configs/grpo_arith.yaml"]) == 2
    assert capsys.readouterr().err == ("dockflow train: error: cannot write /runs/x/summary.json: no space left on the "
                                       "device (ENOSPC): free space there, or point the run's directories elsewhere\n")
