"""Advantage estimators and losses: pure tensor functions, no Ray, files or engines."""

from dockflow.algos.grpo import PolicyLossOutput, clipped_policy_loss, grpo_advantages
from dockflow.algos.kl import kl_penalty
from dockflow.algos.utils import masked_mean, masked_sum

__all__ = ["PolicyLossOutput", "clipped_policy_loss", "grpo_advantages", "kl_penalty", "masked_mean", "masked_sum"]
