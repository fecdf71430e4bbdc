"""Masked tensor helpers shared by the estimators and losses.

Token tensors are ``[B, R]`` over response tokens with a ``response_mask`` (1 = real token, 0 = padding).
Every helper here ignores the values at masked positions, so padding may hold anything finite.
"""

from __future__ import annotations

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1: over everything, or along ``dim``."""
    product = values * mask
    return product.sum() if dim is None else product.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, denom: float | torch.Tensor | None = None) -> torch.Tensor:
    """Token-level mean over ``mask``; ``denom`` overrides the token count (gradient accumulation).

    An all-zero mask gives 0, not NaN, so a micro-batch of empty responses contributes nothing.
    """
    total = masked_sum(values, mask)
    count = mask.sum() if denom is None else torch.as_tensor(denom, dtype=values.dtype)
    return total / count.clamp(min=1)


def group_mean_std(grouped: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise mean and unbiased std of ``[G, N]`` over the entries that are not NaN (unscorable samples), both
    ``[G, 1]``: NaN where a row has no such entry (mean) or fewer than two (std)."""
    valid = ~torch.isnan(grouped)
    count = valid.sum(dim=1, keepdim=True)
    mean = torch.where(valid, grouped, 0.0).sum(dim=1, keepdim=True) / count
    var = torch.where(valid, grouped - mean, 0.0).square().sum(dim=1, keepdim=True) / (count - 1)
    return mean, var.sqrt()


def zero_nan(values: torch.Tensor) -> torch.Tensor:
    """``values`` with NaN (an unscorable sample's advantage) replaced by 0; infinities kept."""
    return torch.where(torch.isnan(values), torch.zeros_like(values), values)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / std`` with mean and (biased) variance over the real tokens of the whole tensor.

    The variance is clamped at ``eps`` before the square root (as in OpenRLHF), so a constant input or a
    single real token whitens to 0. Masked positions are 0; an all-masked input gives all zeros.
    """
    keep = mask.bool()
    real = torch.where(keep, values, torch.zeros_like(values))
    count = keep.sum().clamp(min=1)
    mean = real.sum() / count
    var = torch.where(keep, (values - mean).square(), torch.zeros_like(values)).sum() / count
    whitened = (values - mean) * torch.rsqrt(var.clamp(min=eps))
    return torch.where(keep, whitened, torch.zeros_like(values))


def masked_discounted_cumsum(values: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Reverse discounted sum along the last dim over real tokens: ``out_t = x_t + gamma * out_next``.

    ``out_next`` is the output at the next *real* token (masked positions are skipped, so a hole in the
    mask, e.g. a tool output in a multi-turn response, does not break the chain); after the last real
    token it is 0. Masked positions are 0.
    """
    keep = mask.bool()
    running = values.new_zeros(values.shape[:-1])
    columns = []
    for t in range(values.shape[-1] - 1, -1, -1):
        running = torch.where(keep[..., t], values[..., t] + gamma * running, running)
        columns.append(torch.where(keep[..., t], running, torch.zeros_like(running)))
    if not columns:
        return torch.zeros_like(values)
    return torch.stack(columns[::-1], dim=-1)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token of each row of a ``[B, R]`` mask; -1 for a row with none."""
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    marked = torch.where(mask.bool(), positions, torch.full_like(positions, -1))
    if mask.shape[-1] == 0:
        return torch.full(mask.shape[:-1], -1, dtype=torch.long, device=mask.device)
    return marked.max(dim=-1).values


def next_real_index(mask: torch.Tensor) -> torch.Tensor:
    """For each position of a ``[B, R]`` mask, the index of the next real token strictly after it, or R."""
    width = mask.shape[-1]
    positions = torch.arange(width, device=mask.device).expand_as(mask)
    marked = torch.where(mask.bool(), positions, torch.full_like(positions, width))
    shifted = torch.cat([marked[..., 1:], torch.full_like(marked[..., :1], width)], dim=-1)
    return shifted.flip(-1).cummin(dim=-1).values.flip(-1)
