"""Truncated importance sampling (TIS) against the behaviour policy that generated the tokens.

The generation engine (vLLM, or a generator worker holding older weights) samples from a slightly different
distribution than the one the trainer's ``old_log_prob`` describes. Following verl's TIS ("Your efficient RL
framework secretly brings you off-policy RL training", Yao et al., 2025), each token's policy loss is weighted
by ``min(exp(old_log_prob - rollout_log_prob), cap)``: the ratio of the trainer's old policy to the behaviour
policy, truncated at ``cap`` to bound the variance. The weights carry no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dockflow.algos.utils import masked_mean


@dataclass
class TISWeights:
    weights: torch.Tensor  # [B, R], detached, 0 nowhere special (mask them yourself)
    mean: torch.Tensor  # mean weight over the masked-in tokens
    truncated_fraction: torch.Tensor  # fraction of masked-in tokens whose ratio exceeded the cap


def truncated_is_weights(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, response_mask: torch.Tensor, cap: float
) -> TISWeights:
    """Per-token weights ``min(exp(old_logp - rollout_logp), cap)`` on [B, R] tensors, and their statistics."""
    if cap <= 0:
        raise ValueError(f"the TIS cap must be positive, got {cap}")
    with torch.no_grad():
        ratio = torch.exp((old_logp - rollout_logp).float().clamp(-20.0, 20.0))
        weights = ratio.clamp(max=cap)
        mask = response_mask.float()
        return TISWeights(weights, masked_mean(weights, mask), masked_mean((ratio > cap).float(), mask))
