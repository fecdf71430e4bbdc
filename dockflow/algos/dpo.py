"""DPO (Rafailov et al., 2023, "Direct Preference Optimization: Your Language Model is Secretly a Reward
Model"): a classification loss on preference pairs, no reward model and no sampling.

With sequence log-probs ``pi_c, pi_r`` (policy, chosen / rejected) and ``ref_c, ref_r`` (reference),
``h = (pi_c - pi_r) - (ref_c - ref_r)`` and

    loss = -(1 - eps) * log sigmoid(beta * h) - eps * log sigmoid(-beta * h)

averaged over pairs; ``eps = label_smoothing`` is conservative DPO (cDPO, Mitchell 2023: the labels are
flipped with probability eps), ``eps = 0`` plain DPO. The implicit rewards are ``beta * (pi - ref)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dockflow.algos.utils import masked_sum


def sequence_log_probs(token_logp: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B, R]`` token log-probs -> ``[B]`` sequence log-probs: the sum over real tokens (0 for none)."""
    return masked_sum(token_logp, response_mask.to(token_logp.dtype), dim=-1)


@dataclass
class DPOOutput:
    """``loss`` carries the gradient; the rest are detached batch means for logging."""

    loss: torch.Tensor
    chosen_reward: torch.Tensor  # mean of beta * (pi_c - ref_c)
    rejected_reward: torch.Tensor  # mean of beta * (pi_r - ref_r)
    reward_accuracy: torch.Tensor  # share of pairs with chosen_reward > rejected_reward
    margin: torch.Tensor  # mean of pi_c - pi_r (policy log-probs only)


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> DPOOutput:
    """DPO loss on ``[B]`` sequence log-probs of B preference pairs: the mean over the pairs."""
    if not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5], got {label_smoothing}")
    logits = beta * ((policy_chosen - policy_rejected) - (ref_chosen - ref_rejected))
    per_pair = -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    loss = per_pair.sum() / max(per_pair.numel(), 1)
    with torch.no_grad():
        chosen = beta * (policy_chosen - ref_chosen)
        rejected = beta * (policy_rejected - ref_rejected)
        zero = per_pair.new_zeros(())
        if per_pair.numel() == 0:
            return DPOOutput(loss, zero, zero, zero, zero)
        return DPOOutput(
            loss,
            chosen.mean(),
            rejected.mean(),
            (chosen > rejected).to(per_pair.dtype).mean(),
            (policy_chosen - policy_rejected).mean(),
        )
