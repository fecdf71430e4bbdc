"""pass@k (Chen et al. 2021) and avg@k against hand-computed cases."""

from __future__ import annotations

import math

import pytest

from dockflow.eval import avg_at_k, pass_at_k, sample_scores


@pytest.mark.parametrize(
    ("n", "c", "k", "want"),
    [
        (10, 3, 2, 1 - 21 / 45),  # 1 - C(7,2)/C(10,2)
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 1, 1, 0.2),  # pass@1 = c/n
        (5, 0, 3, 0.0),
        (5, 5, 3, 1.0),
        (4, 2, 3, 1.0),  # n - c < k: every draw of 3 holds a correct one
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_hand_computed(n: int, c: int, k: int, want: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


def test_pass_at_k_matches_binomials_and_is_stable_for_large_n() -> None:
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)  # C(2000, 1000) overflows a float
    assert 0.0 < pass_at_k(100_000, 3, 10) < 1.0


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="0 <= c <= n and 1 <= k <= n"):
        pass_at_k(n, c, k)


def test_avg_at_k_and_sample_scores() -> None:
    assert avg_at_k([1.0, 0.0, 0.0, 1.0]) == 0.5
    with pytest.raises(ValueError, match="at least one sample"):
        avg_at_k([])
    assert sample_scores([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]], k=2) == {"pass@2": pytest.approx(2 / 3), "avg@2": 0.5}
    # 4 samples, pass@2: problem 1 has 1 correct (1 - C(3,2)/C(4,2) = 0.5), problem 2 none
    assert sample_scores([[0, 1, 0, 0], [0, 0, 0, 0]], k=2) == {"pass@2": 0.25, "avg@2": 0.125}
    assert sample_scores([], k=4) == {"pass@4": 0.0, "avg@4": 0.0}
