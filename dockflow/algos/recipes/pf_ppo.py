"""PF-PPO (Zhang et al., 2024): PPO trained only on responses filtered by reward.

One iteration: like PPO (``recipes/ppo.py``), except that the advantage state keeps ``keep`` of each group's N
responses (``mode``: best and worst, best, worst, or sampled by reward; ``algos/pf_ppo.py: filter_by_reward``)
and gives GAE advantages to those alone; the update trains on G x keep samples (``train_batch``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.recipe import Algorithm, PolicyGradientSection
from dockflow.algos.recipes.ppo import PPOConfig, gae
from dockflow.config.base import Section

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config


class PFPPOConfig(Section):
    """Which responses a group keeps."""

    keep: int = Field(4, ge=1, description="Responses kept per prompt (of rollout.group_size).")
    mode: Literal["best_worst", "best", "worst", "reward_weighted"] = Field(
        "best_worst", description="Which responses a group keeps."
    )
    temperature: float = Field(1.0, gt=0.0, description="Softmax temperature of reward_weighted sampling.")


class PFPPOSection(PolicyGradientSection):
    """PF-PPO: PPO's critic and GAE (``ppo``) and the filter (``pf_ppo``)."""

    name: Literal["pf_ppo"] = "pf_ppo"
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    pf_ppo: PFPPOConfig = Field(default_factory=PFPPOConfig)


class PFPPO(Algorithm):
    name = "pf_ppo"
    section = PFPPOSection
    critic = True
    kl = "reward"
    group_advantages = False

    def critic_section(self, cfg: Config) -> PPOConfig:
        return cfg.algorithm.ppo

    def train_batch(self, cfg: Config) -> int:
        return cfg.rollout.prompts_per_iter * cfg.algorithm.pf_ppo.keep

    def check(self, cfg: Config) -> None:
        keep = cfg.algorithm.pf_ppo.keep
        if keep > cfg.rollout.group_size:
            raise ValueError(f"algorithm.pf_ppo.keep={keep} must be at most rollout.group_size={cfg.rollout.group_size}: "
                             "a group keeps some of its own responses")
        if self.train_batch(cfg) % cfg.train.mini_batch_size:
            raise ValueError(
                f"train.mini_batch_size={cfg.train.mini_batch_size} must divide the filtered batch "
                f"rollout.prompts_per_iter x algorithm.pf_ppo.keep = {self.train_batch(cfg)}: the update trains on it"
            )

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        from dockflow.algos.pf_ppo import filter_by_reward

        pf = cfg.algorithm.pf_ppo
        kept = filter_by_reward(data["rewards"], cfg.rollout.group_size, pf.keep, pf.mode, generator=generator,
                                temperature=pf.temperature)
        kl = self.token_kl(cfg, data)
        return kept, gae(cfg, data[kept], None if kl is None else kl[kept])
