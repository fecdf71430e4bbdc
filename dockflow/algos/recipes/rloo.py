"""RLOO (Ahmadian et al., 2024, "Back to Basics"; the REINFORCE leave-one-out baseline of Kool et al., 2019).

One iteration:

1. generate: N >= 2 responses per prompt.
2. infer: each response's reward, minus ``kl_coef`` x its summed KL to the reference when ``kl_coef > 0`` (the
   KL is part of the reward, as TRL's RLOOTrainer does); its advantage is that reward minus the mean reward of the
   group's other N - 1 responses (``rloo_advantages``, ``algos/rloo.py``), optionally normalised over the batch; old and reference
   log-probs.
3. update: the PPO-style clipped surrogate on the per-token ratio (TRL's RLOOTrainer loss), no KL term in the
   loss; with one epoch and one mini-batch per iteration it is plain REINFORCE with the leave-one-out baseline.
4. reshard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.recipe import Algorithm, PolicyGradientSection
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


class RLOO(Algorithm):
    name = "rloo"
    section = RLOOSection
    kl = "reward"

    def check(self, cfg: Config) -> None:
        if cfg.rollout.group_size < 2:
            raise ValueError("algorithm.name=rloo needs rollout.group_size >= 2: the baseline is the group's other responses")

    def advantage_batch_size(self, cfg: Config) -> int:
        if cfg.algorithm.rloo.normalize_advantages:  # a std over the whole batch
            return cfg.global_batch
        return super().advantage_batch_size(cfg)

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        import torch
        from tensordict import TensorDict

        from dockflow.algos.rloo import rloo_advantages

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
