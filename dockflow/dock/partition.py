"""Equal-count, near-equal-weight partitions of samples (sequence-length balancing across DP ranks).

Pure Python: the dock's controllers import it (no torch there) to split a mini-batch among data-parallel
ranks from metadata alone.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Literal

from dockflow.dock.errors import DockInvalid


def balanced_partitions(
    weights: Sequence[float], k: int, method: Literal["kk", "greedy"] = "kk"
) -> list[list[int]]:
    """Split positions ``0..len(weights)-1`` into ``k`` parts of equal count with near-equal weight sums.

    ``kk``: Karmarkar-Karp largest differencing (each initial state deals k consecutive sorted items one per
    part, states are merged heaviest-with-lightest by largest spread). ``greedy``: heaviest item first to the
    lightest part that still has room. Each part comes back ascending.
    """
    n = len(weights)
    if k <= 0 or n % k:
        raise DockInvalid(f"cannot split {n} samples into {k} parts of equal count")
    if method == "greedy":
        parts = _greedy(weights, k)
    elif method == "kk":
        parts = _karmarkar_karp(weights, k)
    else:
        raise DockInvalid(f"unknown partition method {method!r}")
    return [sorted(p) for p in parts]


def _greedy(weights: Sequence[float], k: int) -> list[list[int]]:
    room = len(weights) // k
    parts: list[list[int]] = [[] for _ in range(k)]
    heap = [(0.0, p) for p in range(k)]
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        load, p = heapq.heappop(heap)
        parts[p].append(i)
        if len(parts[p]) < room:
            heapq.heappush(heap, (load + weights[i], p))
    return parts


def _karmarkar_karp(weights: Sequence[float], k: int) -> list[list[int]]:
    order = sorted(range(len(weights)), key=lambda i: (weights[i], i))
    heap: list[tuple[float, int, list[tuple[float, list[int]]]]] = []
    for s, start in enumerate(range(0, len(order), k)):
        state = sorted(((weights[i], [i]) for i in order[start : start + k]), key=lambda p: p[0], reverse=True)
        heapq.heappush(heap, (-(state[0][0] - state[-1][0]), s, state))
    tiebreak = len(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(wa + wb, ia + ib) for (wa, ia), (wb, ib) in zip(a, reversed(b), strict=True)]
        merged.sort(key=lambda p: p[0], reverse=True)
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tiebreak, merged))
        tiebreak += 1
    return [items for _, items in heap[0][2]]
