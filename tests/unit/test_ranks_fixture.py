"""The suite's rank launcher (``tests/fixtures/ranks.py``): a rank that hangs is killed and named within its timeout,
a rank that fails raises its error, ranks that finish return."""

import time

import pytest
from fixtures.ranks import start_ranks
from torch.multiprocessing import ProcessRaisedException


def _sleepy(rank: int, seconds: float) -> None:
    time.sleep(seconds if rank == 1 else 0)


def _fails(rank: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 refused")


def test_a_hung_rank_is_killed_and_named():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"_sleepy: ranks \[1\] of 2 still running after 3 s"):
        start_ranks(_sleepy, (60.0,), 2, timeout_s=3)
    assert time.monotonic() - start < 30


def test_a_failing_rank_raises_its_error():
    with pytest.raises(ProcessRaisedException, match="rank 1 refused"):
        start_ranks(_fails, (), 2)


def test_ranks_that_finish_return():
    start_ranks(_sleepy, (0.5,), 2)
