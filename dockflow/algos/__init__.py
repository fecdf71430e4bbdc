"""Advantage estimators and losses: pure tensor functions, no Ray, files or engines."""

from dockflow.algos.dapo import informative_groups, overlong_penalty
from dockflow.algos.dpo import DPOOutput, dpo_loss, sequence_log_probs
from dockflow.algos.grpo import PolicyLossOutput, clipped_policy_loss, grpo_advantages
from dockflow.algos.kl import KLEstimator, kl_penalty
from dockflow.algos.pf_ppo import FilterMode, filter_by_reward
from dockflow.algos.ppo import clipped_value_loss, gae_advantages, outcome_token_rewards
from dockflow.algos.reinforce_pp import reinforce_pp_advantages
from dockflow.algos.tis import TISWeights, truncated_is_weights
from dockflow.algos.utils import (
    last_token_index,
    masked_discounted_cumsum,
    masked_mean,
    masked_sum,
    masked_whiten,
    next_real_index,
)

__all__ = [
    "DPOOutput",
    "FilterMode",
    "KLEstimator",
    "PolicyLossOutput",
    "TISWeights",
    "clipped_policy_loss",
    "clipped_value_loss",
    "dpo_loss",
    "filter_by_reward",
    "gae_advantages",
    "grpo_advantages",
    "informative_groups",
    "kl_penalty",
    "last_token_index",
    "masked_discounted_cumsum",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "next_real_index",
    "outcome_token_rewards",
    "overlong_penalty",
    "reinforce_pp_advantages",
    "sequence_log_probs",
    "truncated_is_weights",
]
