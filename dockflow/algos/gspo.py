"""GSPO's loss (Zheng et al., 2025, "Group Sequence Policy Optimization"): the clipped surrogate on one
length-normalised importance ratio per response,

    s_i  = exp(mean_t [logp_t - old_logp_t])
    loss = sum_i max(-A_i s_i, -A_i clip(s_i, 1 - clip_low, 1 + clip_high)) / sequences

Each response counts once, whatever its length. The recipe is ``dockflow.algos.recipes.gspo``.
"""

from __future__ import annotations

import torch


def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
              clip_low: float, clip_high: float, sequences: float | None = None) -> dict[str, torch.Tensor]:
    """GSPO's clipped surrogate on [B, R] token tensors. ``advantages`` is per token (a response's value broadcast
    over its tokens) or per response [B]; ``sequences``: responses in the whole mini-batch when this call sees a
    micro-batch of it (default: this call's). A response without tokens (masked out) adds nothing.
    Returns ``loss`` (with grad), and ``pg_loss``, ``clip_fraction``, ``ratio_mean``, ``log_ratio`` (no grad)."""
    mask = response_mask.to(logp.dtype)
    lengths = mask.sum(-1)
    live = (lengths > 0).to(logp.dtype)
    mean_log_ratio = ((logp - old_logp) * mask).sum(-1) / lengths.clamp(min=1.0)
    ratio = torch.exp(mean_log_ratio.clamp(-20.0, 20.0))
    adv = advantages if advantages.ndim == 1 else (advantages * mask).sum(-1) / lengths.clamp(min=1.0)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_seq = torch.maximum(unclipped, clipped) * live
    denom = float(sequences) if sequences is not None else max(float(live.sum()), 1.0)
    with torch.no_grad():
        n = max(float(live.sum()), 1.0)
        stats = {"pg_loss": per_seq.sum() / n, "clip_fraction": ((clipped > unclipped).to(logp.dtype) * live).sum() / n,
                 "ratio_mean": (ratio * live).sum() / n, "log_ratio": mean_log_ratio.detach()}
    return {"loss": per_seq.sum() / denom, **stats}
