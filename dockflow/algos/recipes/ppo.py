"""PPO (Schulman et al., 2017; Ouyang et al., 2022 for LLMs): a critic and GAE.

One iteration:

1. generate: N responses per prompt (N = 1 is classic PPO; more is allowed) into the dock window.
2. infer: the verifier's reward lands on each response's last token, minus ``kl_coef`` x the per-token KL to
   the reference when ``kl_coef > 0`` (``algos/ppo.py: outcome_token_rewards``); the critic worker estimates a
   value before every response token (``workers/critic.py``); the reward worker turns them into GAE advantages
   and returns (``gae``, ``algos/ppo.py: gae_advantages``), whitened over the batch; old and reference log-probs.
3. update: the actor's clipped surrogate on the per-token ratio; the critic's clipped value loss against the
   returns (``algos/ppo.py: clipped_value_loss``).
4. reshard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.recipe import Algorithm, CriticSection, PolicyGradientSection

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config


class PPOConfig(CriticSection):
    """PPO's critic and GAE (also used by PF-PPO)."""

    key = "algorithm.ppo"
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount over response tokens.")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="GAE lambda (bias/variance trade-off).")
    whiten_advantages: bool = Field(True, description="Normalise GAE advantages over the batch's tokens.")


class PPOSection(PolicyGradientSection):
    """PPO: ``kl_coef`` is a per-token reward penalty."""

    name: Literal["ppo"] = "ppo"
    ppo: PPOConfig = Field(default_factory=PPOConfig)


def gae(cfg: Config, data: TensorDict, kl: torch.Tensor | None) -> TensorDict:
    """GAE advantages and returns from outcome rewards (and the per-token KL penalty) and the critic's values.

    A sample with a NaN reward (no reward applies to it) is out of the update: advantage 0, out of the
    whitening, and its returns are the critic's own values, so the critic learns nothing from it either."""
    import torch
    from tensordict import TensorDict

    from dockflow.algos.ppo import gae_advantages, outcome_token_rewards
    from dockflow.algos.utils import zero_nan

    ppo, values = cfg.algorithm.ppo, data["values"]
    scored = ~torch.isnan(data["rewards"])
    mask = data["response_mask"] * scored.unsqueeze(1)
    token_rewards = outcome_token_rewards(zero_nan(data["rewards"]), mask, kl, cfg.algorithm.kl_coef)
    adv, ret = gae_advantages(token_rewards, values, mask, ppo.gamma, ppo.lam, whiten=ppo.whiten_advantages)
    ret = torch.where(scored.unsqueeze(1), ret, values.to(ret.dtype) * data["response_mask"])
    return TensorDict({"advantages": adv, "returns": ret}, batch_size=[len(mask)])


class PPO(Algorithm):
    name = "ppo"
    section = PPOSection
    critic = True
    kl = "reward"
    group_advantages = False  # whitening spans the batch

    def critic_section(self, cfg: Config) -> PPOConfig:
        return cfg.algorithm.ppo

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        import torch

        return torch.arange(len(data)), gae(cfg, data, self.token_kl(cfg, data))
