"""Masked reductions shared by the losses: every loss averages over real response tokens only."""

from __future__ import annotations

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1."""
    return (values * mask).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor, denom: float | torch.Tensor | None = None) -> torch.Tensor:
    """Token-level mean over ``mask``; ``denom`` overrides the token count (gradient accumulation).

    An all-zero mask gives 0, not NaN, so a micro-batch of empty responses contributes nothing.
    """
    total = masked_sum(values, mask)
    count = mask.sum() if denom is None else torch.as_tensor(denom, dtype=values.dtype)
    return total / count.clamp(min=1)
