"""RLOO (Ahmadian et al., 2024, "Back to Basics"; the REINFORCE leave-one-out baseline of Kool et al., 2019).

One iteration:

1. generate: N >= 2 responses per prompt.
2. infer: each response's reward, minus ``kl_coef`` x its summed KL to the reference when ``kl_coef > 0`` (the
   KL is part of the reward, as TRL's RLOOTrainer does); its advantage is that reward minus the mean reward of the
   group's other N - 1 responses (``rloo_advantages``), optionally normalised over the batch; old and reference
   log-probs.
3. update: the PPO-style clipped surrogate on the per-token ratio (TRL's RLOOTrainer loss; ``losses.py:
   clipped_surrogate``), no KL term in the loss; with one epoch and one mini-batch per iteration it is plain
   REINFORCE with the leave-one-out baseline.
4. reshard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.base import Algorithm, PolicyGradientSection, policy_gradient_columns
from dockflow.algos.losses import clipped_surrogate
from dockflow.config.base import Section

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config


class RLOOConfig(Section):
    """RLOO's advantage."""

    normalize_advantages: bool = Field(
        False, description="Divide the leave-one-out advantages by their std over the whole batch (TRL's option; off by default)."
    )


class RLOOSection(PolicyGradientSection):
    """RLOO: ``kl_coef`` is a sequence-level reward penalty."""

    name: Literal["rloo"] = "rloo"
    rloo: RLOOConfig = Field(default_factory=RLOOConfig)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[G*N]`` rewards, group by group -> each minus the mean of its group's other N - 1 rewards.

    A NaN reward (a sample no reward applies to) is in no baseline and gets advantage 0, as does a sample
    whose group has no other scored reward."""
    import torch

    from dockflow.algos.utils import zero_nan

    if rewards.ndim != 1 or group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D in groups of group_size={group_size} >= 2, got {tuple(rewards.shape)}")
    grouped = rewards.float().view(-1, group_size)
    scored = ~torch.isnan(grouped)
    values = torch.where(scored, grouped, 0.0)
    others = (values.sum(dim=1, keepdim=True) - values) / (scored.sum(dim=1, keepdim=True) - 1)
    return zero_nan(torch.where(scored, values - others, float("nan"))).reshape(-1)


class RLOO(Algorithm):
    name = "rloo"
    section = RLOOSection
    kl = "reward"

    def check(self, cfg: Config) -> None:
        if cfg.rollout.group_size < 2:
            raise ValueError("algorithm.name=rloo needs rollout.group_size >= 2: the baseline is the group's other responses")

    def consumers(self, cfg: Config) -> dict[str, list[str]]:
        return policy_gradient_columns(cfg, self)

    def advantage_batch_size(self, cfg: Config) -> int:
        if cfg.algorithm.rloo.normalize_advantages:  # a std over the whole batch
            return cfg.global_batch
        return super().advantage_batch_size(cfg)

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        import torch
        from tensordict import TensorDict

        mask = data["response_mask"]
        rewards = data["rewards"].float()
        kl = self.token_kl(cfg, data)
        if kl is not None:
            rewards = rewards - cfg.algorithm.kl_coef * (kl * mask).sum(-1)
        adv = rloo_advantages(rewards, cfg.rollout.group_size)
        scored = ~torch.isnan(rewards)
        if cfg.algorithm.rloo.normalize_advantages and int(scored.sum()) > 1:
            adv = adv / (adv[scored].std() + 1e-8)
        return torch.arange(len(mask)), TensorDict({"advantages": adv.unsqueeze(-1) * mask}, batch_size=[len(mask)])

    def policy_loss(self, cfg: Config, logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The symmetric clipped surrogate, token-level mean; no KL term (the KL is in the rewards)."""
        return clipped_surrogate(self, cfg, logp, micro, tokens)
