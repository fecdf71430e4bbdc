"""GRPO: group-normalised advantages and the clipped policy loss with a KL penalty to the reference.

For each prompt, N responses form a group. A response's advantage is its reward minus the group mean,
divided by the group std (Shao et al., 2024, DeepSeekMath). The loss is PPO's clipped surrogate on the
per-token importance ratio against the behaviour policy, plus ``kl_coef`` times a KL estimate to the
reference policy, averaged over all response tokens of the mini-batch (token-level mean).

Clip-higher (DAPO, Yu et al., 2025): ``clip_eps_high`` decouples the upper bound of the ratio clip from
the lower one, ``clip(ratio, 1 - clip_eps, 1 + clip_eps_high)``, so low-probability tokens with a positive
advantage can grow further (against entropy collapse).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dockflow.algos.kl import KLEstimator, kl_penalty
from dockflow.algos.utils import group_mean_std, masked_mean, zero_nan


def grpo_advantages(
    rewards: torch.Tensor, group_size: int, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Per-sample advantages from per-sample rewards laid out group by group ([G*N] -> [G*N]).

    A group whose rewards are all equal carries no signal and gets advantage 0 for every member. A NaN reward
    (a sample no reward applies to) is left out of its group's mean and std and gets advantage 0, as TRL does.
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, got {tuple(rewards.shape)}")
    grouped = rewards.float().view(-1, group_size)
    mean, std = group_mean_std(grouped)
    centred = grouped - mean
    if norm_by_std and group_size > 1:
        centred = centred / (std + eps)
    return zero_nan(centred).reshape(-1)


@dataclass
class PolicyLossOutput:
    loss: torch.Tensor
    pg_loss: torch.Tensor
    kl: torch.Tensor
    clip_fraction: torch.Tensor
    approx_kl_old: torch.Tensor


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    token_denom: float | None = None,
    clip_eps_high: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """GRPO loss on [B, R] token tensors; ``advantages`` is per sample [B] or per token [B, R].

    The ratio is clipped to ``[1 - clip_eps, 1 + clip_eps_high]``; ``clip_eps_high=None`` means
    ``clip_eps`` (the symmetric PPO clip). ``token_weights`` [B, R] (no grad) scale each token's policy term,
    e.g. truncated importance-sampling weights against the behaviour policy (``dockflow.algos.tis``).

    ``token_denom`` is the number of response tokens in the whole mini-batch when this call sees one
    micro-batch of it, so that summed micro-batch gradients equal the mini-batch token-level mean.
    """
    mask = response_mask.to(logp.dtype)
    adv = advantages.unsqueeze(-1) if advantages.ndim == 1 else advantages
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
    unclipped = -adv * ratio
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    clipped = -adv * ratio.clamp(1.0 - clip_eps, 1.0 + eps_high)
    pg_tok = torch.maximum(unclipped, clipped)
    if token_weights is not None:
        pg_tok = pg_tok * token_weights
    if kl_coef > 0.0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp (the reference worker's log-probs)")
        kl_tok = kl_penalty(logp, ref_logp, kl_estimator)
    else:
        kl_tok = torch.zeros_like(logp)
    loss = masked_mean(pg_tok + kl_coef * kl_tok, mask, token_denom)
    # Reported values are means over this call's tokens, whatever token_denom is.
    with torch.no_grad():
        pg_loss = masked_mean(pg_tok, mask)
        kl = masked_mean(kl_tok, mask)
        clip_fraction = masked_mean((clipped > unclipped).to(logp.dtype), mask)
        approx_kl_old = masked_mean(0.5 * log_ratio.square(), mask)
    return PolicyLossOutput(loss, pg_loss, kl, clip_fraction, approx_kl_old)
