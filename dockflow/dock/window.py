"""Windows: a dock that holds several iterations at once gives each its own slice ``[lo, hi)`` of indices.

A get limited to a window only takes samples from it; a reset limited to a window drops only its samples
(and cancels only the gets waiting on it), so the iterations in the other windows go on undisturbed.
"""

from __future__ import annotations

import numpy as np

Window = tuple[int, int]


def window_mask(capacity: int, window: Window | None) -> np.ndarray:
    """Boolean mask of the indices in ``window`` (all of them when None)."""
    if window is None:
        return np.ones(capacity, dtype=bool)
    mask = np.zeros(capacity, dtype=bool)
    mask[window[0] : window[1]] = True
    return mask


def dropped_mask(capacity: int, keep: np.ndarray, window: Window | None) -> np.ndarray:
    """What a reset drops: the indices in ``window`` that are not kept."""
    dropped = window_mask(capacity, window)
    dropped[keep] = False
    return dropped
