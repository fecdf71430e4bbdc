"""PF-PPO (Zhang et al., 2024, "Policy Filtration in RLHF to Fine-Tune LLM for Code Generation"):
train only on the responses whose rewards are most reliable.

The reward model is more reliable at the extremes of its range, so for each prompt N responses are
sampled and only ``keep`` of them go to the policy update:

- ``best``: the ``keep`` highest rewards (best-of-N, BoN);
- ``worst``: the ``keep`` lowest rewards;
- ``best_worst``: ``ceil(keep/2)`` highest and ``floor(keep/2)`` lowest (BW, the paper's choice);
- ``reward_weighted``: ``keep`` drawn without replacement with probabilities
  ``softmax(rewards / temperature)`` within the group.

Ranking and ties: responses are ranked by reward, equal rewards by index (lower index ranks higher), so
``best`` prefers the lower index among ties and ``worst`` the higher one; best and worst never overlap.
A NaN reward (a response no reward applies to) is kept only where its group has too few scored responses:
never before a scored one, whatever the mode (it then trains with advantage 0).

One iteration: like PPO (``ppo.py``), except that the advantage state keeps ``keep`` of each group's N
responses (``mode``; ``filter_by_reward`` below) and gives GAE advantages to those alone (``ppo.py: gae``); the
update trains on G x keep samples (``train_batch``) with the clipped surrogate (``losses.py: clipped_surrogate``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.base import Algorithm, PolicyGradientSection, policy_gradient_columns
from dockflow.algos.losses import clipped_surrogate
from dockflow.algos.ppo import PPOConfig, gae
from dockflow.config.base import Section

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config

FilterMode = Literal["best_worst", "best", "worst", "reward_weighted"]


def filter_by_reward(
    rewards: torch.Tensor,
    group_size: int,
    keep: int,
    mode: FilterMode,
    generator: torch.Generator | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``[G*N]`` rewards laid out group by group -> the global indices kept (long, ``[G*keep]``).

    Exactly ``keep`` per group, ascending within a group, groups in order. ``generator`` seeds the draw of
    ``reward_weighted`` (Gumbel-top-k, the same distribution as drawing one at a time without
    replacement); the other modes are deterministic.
    """
    import torch

    above_any_reward = torch.finfo(torch.float64).max  # an unscored response's rank key where low rewards are kept
    if rewards.ndim != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, got {tuple(rewards.shape)}")
    if not 0 <= keep <= group_size:
        raise ValueError(f"keep must be in [0, group_size={group_size}], got {keep}")
    grouped = rewards.detach().view(-1, group_size).double()
    unscored = torch.isnan(grouped)

    def descending(keys: torch.Tensor) -> torch.Tensor:
        # Reward descending, ties by ascending index (a stable sort keeps index order among ties).
        return torch.sort(keys, dim=1, descending=True, stable=True).indices

    best_key = torch.where(unscored, -math.inf, grouped)  # unscored rank last
    worst_key = torch.where(unscored, above_any_reward, grouped)  # unscored rank just above the lowest kept
    if mode == "best":
        local = descending(best_key)[:, :keep]
    elif mode == "worst":
        local = descending(worst_key)[:, group_size - keep :]
    elif mode == "best_worst":
        n_best = (keep + 1) // 2
        best = descending(best_key)[:, :n_best]
        taken = torch.zeros_like(unscored).scatter(1, best, True)  # never picked again as a worst one
        worst = descending(torch.where(taken, math.inf, worst_key))[:, group_size - (keep - n_best) :]
        local = torch.cat([best, worst], dim=1)
    elif mode == "reward_weighted":
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        device = generator.device if generator is not None else grouped.device
        uniform = torch.rand(grouped.shape, generator=generator, device=device).to(grouped.device)
        gumbel = -torch.log(-torch.log(uniform.clamp(1e-20, 1.0 - 1e-7)))
        logits = torch.where(unscored, -math.inf, grouped.float() / temperature)
        logits = torch.where(unscored.all(dim=1, keepdim=True), 0.0, logits)  # nothing scored: a uniform draw
        keys = torch.log_softmax(logits, dim=1) + gumbel
        local = torch.topk(keys, keep, dim=1).indices
    else:
        raise ValueError(f"unknown filter mode '{mode}': use best_worst, best, worst or reward_weighted")
    offsets = torch.arange(grouped.shape[0], device=grouped.device).unsqueeze(1) * group_size
    return (local.sort(dim=1).values + offsets).reshape(-1).long()


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

    def consumers(self, cfg: Config) -> dict[str, list[str]]:
        """PPO's states (with the critic's)."""
        return policy_gradient_columns(cfg, self)

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        """The kept responses (``filter_by_reward``) and their GAE advantages and returns."""
        pf = cfg.algorithm.pf_ppo
        kept = filter_by_reward(data["rewards"], cfg.rollout.group_size, pf.keep, pf.mode, generator=generator,
                                temperature=pf.temperature)
        kl = self.token_kl(cfg, data)
        return kept, gae(cfg, data[kept], None if kl is None else kl[kept])

    def policy_loss(self, cfg: Config, logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        return clipped_surrogate(self, cfg, logp, micro, tokens)
