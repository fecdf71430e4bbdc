"""``exclusive_lock``: one holder at a time, a bounded wait that names what it waited for."""

from __future__ import annotations

import fcntl
import time
from pathlib import Path

import pytest

from dockflow.file_lock import exclusive_lock


def test_a_held_lock_times_out_naming_the_file_and_its_holder(tmp_path: Path) -> None:
    lock = tmp_path / ".store.lock"
    with open(lock, "a+b") as other:  # another open file: flock excludes it even within one process
        fcntl.flock(other.fileno(), fcntl.LOCK_EX)
        start = time.monotonic()
        with pytest.raises(TimeoutError) as err, exclusive_lock(lock, "", timeout_s=0.3, held_by="run A"):
            pass
        assert 0.3 <= time.monotonic() - start < 5
        assert str(err.value) == f"waited 0.3 s for the lock {lock}: run A still holds it"
        fcntl.flock(other.fileno(), fcntl.LOCK_UN)
    with exclusive_lock(lock, "", timeout_s=0.3) as held:  # released: taken at once
        assert held
