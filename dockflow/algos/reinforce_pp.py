"""REINFORCE++ (Hu, 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
Models"; as implemented in OpenRLHF): critic-free advantages with global batch normalisation.

1. Token rewards (:func:`dockflow.algos.ppo.outcome_token_rewards`): the outcome reward on the last real
   token, ``- kl_coef * kl_t`` on every real token.
2. Returns: the discounted reverse cumulative sum ``G_t = r_t + gamma * G_{t+1}`` over the response.
3. Advantages: ``A_t = (G_t - mean) / std``, mean and std over all real tokens of the whole batch.

REINFORCE++-baseline (``group_size`` given): each outcome reward first has its group mean subtracted,
``r_i - mean_{j in group(i)} r_j`` (the N responses to the same prompt), then steps 1-3.

A NaN outcome reward (a sample no reward applies to) is in no group mean and no whitening statistic, and its
advantages are 0.
"""

from __future__ import annotations

import torch

from dockflow.algos.grpo import grpo_advantages
from dockflow.algos.ppo import outcome_token_rewards
from dockflow.algos.utils import masked_discounted_cumsum, masked_whiten, zero_nan


@torch.no_grad()
def reinforce_pp_advantages(
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    group_size: int | None = None,
    eps: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B]`` outcome rewards -> ``(advantages, returns)``, both ``[B, R]``, 0 at masked positions.

    ``eps`` floors the variance of the whitening. A batch whose returns are all equal (e.g. every group
    has equal rewards with the baseline) gets advantage 0, not NaN. No gradient flows through the outputs.
    """
    scored = ~torch.isnan(rewards)
    if group_size is not None:
        rewards = grpo_advantages(rewards, group_size, norm_by_std=False)
    token_rewards = outcome_token_rewards(zero_nan(rewards), response_mask, kl, kl_coef)
    returns = masked_discounted_cumsum(token_rewards, response_mask, gamma)
    return masked_whiten(returns, response_mask * scored.unsqueeze(1), eps=eps), returns
