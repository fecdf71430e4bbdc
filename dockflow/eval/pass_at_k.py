"""Pure scoring functions for sampled evaluation: the unbiased pass@k estimator and avg@k.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", Eq. 1): with ``n`` samples of
which ``c`` are correct, the chance that at least one of ``k`` samples drawn without replacement is correct
is ``1 - C(n-c, k) / C(n, k)``, computed as a product so that large ``n`` neither overflows nor cancels.
avg@k is the mean correctness over the samples (an estimate of pass@1).

    pass_at_k(n=10, c=3, k=2)            # 1 - C(7,2)/C(10,2) = 0.5333...
    sample_scores([[1, 0], [0, 0]], k=2) # {"pass@2": 0.5, "avg@2": 0.25}
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``n`` samples, ``c`` of them correct (needs 0 <= c <= n, 1 <= k <= n)."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def avg_at_k(correct: Sequence[float]) -> float:
    """Mean correctness of one problem's samples (1.0 = correct, 0.0 = wrong)."""
    if not correct:
        raise ValueError("avg_at_k needs at least one sample")
    return sum(correct) / len(correct)


def sample_scores(correct: Sequence[Sequence[float]], k: int) -> dict[str, float]:
    """``{"pass@k", "avg@k"}`` averaged over problems; ``correct[i]`` holds problem i's per-sample scores.

    A sample counts as correct when its score is 1.0. Every problem needs at least ``k`` samples; with
    exactly ``k``, pass@k is the fraction of problems with at least one correct sample. No problems: zeros.
    """
    if not correct:
        return {f"pass@{k}": 0.0, f"avg@{k}": 0.0}
    passes, avgs = [], []
    for row in correct:
        passes.append(pass_at_k(len(row), sum(1 for v in row if v >= 1.0), k))
        avgs.append(avg_at_k(row))
    return {f"pass@{k}": sum(passes) / len(passes), f"avg@{k}": sum(avgs) / len(avgs)}
