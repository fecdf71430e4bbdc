"""Algorithms: one recipe per algorithm (``dockflow.algos.recipes``: config section, worker states and columns,
advantage estimator, loss, checks), over pure tensor functions (advantage estimators, losses, KL estimators;
no Ray, files or engines).

Names are imported lazily (PEP 562): the config imports the recipes' sections, and must not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DPOOutput": "dockflow.algos.dpo",
    "FilterMode": "dockflow.algos.pf_ppo",
    "KLEstimator": "dockflow.algos.kl",
    "PolicyLossOutput": "dockflow.algos.grpo",
    "TISWeights": "dockflow.algos.tis",
    "clipped_policy_loss": "dockflow.algos.grpo",
    "clipped_value_loss": "dockflow.algos.ppo",
    "dpo_loss": "dockflow.algos.dpo",
    "filter_by_reward": "dockflow.algos.pf_ppo",
    "gae_advantages": "dockflow.algos.ppo",
    "grpo_advantages": "dockflow.algos.grpo",
    "gspo_loss": "dockflow.algos.gspo",
    "informative_groups": "dockflow.algos.dapo",
    "kl_penalty": "dockflow.algos.kl",
    "last_token_index": "dockflow.algos.utils",
    "masked_discounted_cumsum": "dockflow.algos.utils",
    "masked_mean": "dockflow.algos.utils",
    "masked_sum": "dockflow.algos.utils",
    "masked_whiten": "dockflow.algos.utils",
    "next_real_index": "dockflow.algos.utils",
    "outcome_token_rewards": "dockflow.algos.ppo",
    "overlong_penalty": "dockflow.algos.dapo",
    "reinforce_pp_advantages": "dockflow.algos.reinforce_pp",
    "rloo_advantages": "dockflow.algos.rloo",
    "sequence_log_probs": "dockflow.algos.dpo",
    "truncated_is_weights": "dockflow.algos.tis",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dockflow.algos' has no attribute {name!r}")
