"""Equal-count, near-equal-weight partitions (Karmarkar-Karp and greedy), the core of length balancing."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dockflow.dock.errors import DockInvalid
from dockflow.dock.partition import balanced_partitions


def spread(weights, parts):
    sums = [sum(weights[i] for i in p) for p in parts]
    return max(sums) - min(sums)


@pytest.mark.parametrize("method", ["kk", "greedy"])
def test_partitions_have_equal_counts_and_cover_everything(method):
    weights = [random.Random(s).randint(1, 2048) for s in range(64)]
    parts = balanced_partitions(weights, 4, method)
    assert [len(p) for p in parts] == [16] * 4
    assert sorted(i for p in parts for i in p) == list(range(64))
    assert all(p == sorted(p) for p in parts)


def test_kk_beats_contiguous_split_on_skewed_lengths():
    weights = list(range(1, 33)) * 2  # sorted runs: a contiguous split is badly unbalanced
    contiguous = [list(range(r * 16, (r + 1) * 16)) for r in range(4)]
    assert spread(weights, balanced_partitions(weights, 4, "kk")) <= 2
    assert spread(weights, contiguous) > 100


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4096), min_size=1, max_size=12).map(lambda xs: xs * 4), st.sampled_from([1, 2, 4]))
def test_kk_spread_is_at_most_the_largest_item(weights, k):
    parts = balanced_partitions(weights, k, "kk")
    assert sorted(i for p in parts for i in p) == list(range(len(weights)))
    assert spread(weights, parts) <= max(weights)


def test_unequal_counts_are_refused():
    with pytest.raises(DockInvalid, match="equal count"):
        balanced_partitions([1, 2, 3], 2)
