"""REINFORCE++ (Hu, 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
Models"; as implemented in OpenRLHF): critic-free, with the KL in the token rewards and batch-normalised returns.

One iteration: N responses per prompt; advantages as below (``reinforce_pp_advantages``), old and reference
log-probs; the update is the clipped surrogate on the per-token ratio (``losses.py: clipped_surrogate``), no KL
term in the loss. Advantages:

1. Token rewards (``ppo.py: outcome_token_rewards``): the outcome reward on the last real
   token, ``- kl_coef * kl_t`` on every real token.
2. Returns: the discounted reverse cumulative sum ``G_t = r_t + gamma * G_{t+1}`` over the response.
3. Advantages: ``A_t = (G_t - mean) / std``, mean and std over all real tokens of the whole batch.

REINFORCE++-baseline (``group_size`` given): each outcome reward first has its group mean subtracted,
``r_i - mean_{j in group(i)} r_j`` (the N responses to the same prompt; ``groups.py: grpo_advantages`` without
the std), then steps 1-3. Both variants are here: ``ReinforcePP`` and ``ReinforcePPBaseline``.

A NaN outcome reward (a sample no reward applies to) is in no group mean and no whitening statistic, and its
advantages are 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.base import Algorithm, PolicyGradientSection, policy_gradient_columns
from dockflow.algos.groups import grpo_advantages
from dockflow.algos.losses import clipped_surrogate
from dockflow.algos.ppo import outcome_token_rewards
from dockflow.config.base import Section

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config


class ReinforcePPConfig(Section):
    """REINFORCE++'s return."""

    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount over response tokens.")


class ReinforcePPSection(PolicyGradientSection):
    """REINFORCE++ and REINFORCE++-baseline: ``kl_coef`` is a per-token reward penalty."""

    name: Literal["reinforce_pp", "reinforce_pp_baseline"] = "reinforce_pp"
    reinforce_pp: ReinforcePPConfig = Field(default_factory=ReinforcePPConfig)


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
    import torch

    from dockflow.algos.utils import masked_discounted_cumsum, masked_whiten, zero_nan

    with torch.no_grad():
        scored = ~torch.isnan(rewards)
        if group_size is not None:
            rewards = grpo_advantages(rewards, group_size, norm_by_std=False)
        token_rewards = outcome_token_rewards(zero_nan(rewards), response_mask, kl, kl_coef)
        returns = masked_discounted_cumsum(token_rewards, response_mask, gamma)
        return masked_whiten(returns, response_mask * scored.unsqueeze(1), eps=eps), returns


class ReinforcePP(Algorithm):
    name = "reinforce_pp"
    section = ReinforcePPSection
    kl = "reward"
    group_advantages = False  # returns are normalised over the batch
    group_baseline = False

    def consumers(self, cfg: Config) -> dict[str, list[str]]:
        """The on-line states; the advantage state reads the old and reference log-probs with kl_coef > 0."""
        return policy_gradient_columns(cfg, self)

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        import torch
        from tensordict import TensorDict

        alg, mask = cfg.algorithm, data["response_mask"]
        group = cfg.rollout.group_size if self.group_baseline else None
        adv, _ = reinforce_pp_advantages(data["rewards"], mask, self.token_kl(cfg, data), alg.kl_coef,
                                         gamma=alg.reinforce_pp.gamma, group_size=group)
        return torch.arange(len(mask)), TensorDict({"advantages": adv}, batch_size=[len(mask)])

    def policy_loss(self, cfg: Config, logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The symmetric clipped surrogate, token-level mean; no KL term (the KL is in the rewards)."""
        return clipped_surrogate(self, cfg, logp, micro, tokens)


class ReinforcePPBaseline(ReinforcePP):
    """REINFORCE++-baseline: each reward first has its group's mean subtracted."""

    name = "reinforce_pp_baseline"
    group_baseline = True
