"""The advantage state of each algorithm: from the columns the dock holds to ``advantages`` (and ``returns``).

Pure dispatch over ``dockflow.algos``; the reward worker runs it on batches it reads from the dock.
Every estimator writes per-token advantages [B, R]; sequence-level ones (GRPO, DAPO) are broadcast over
the response tokens.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from dockflow.algos import (
    filter_by_reward,
    gae_advantages,
    grpo_advantages,
    kl_penalty,
    outcome_token_rewards,
    reinforce_pp_advantages,
)
from dockflow.config import Config
from dockflow.workers.columns import kl_in_reward


def advantage_batch_size(cfg: Config) -> int:
    """GRPO and DAPO normalise within a group, so any whole number of groups will do; PPO, PF-PPO and
    REINFORCE++ normalise over the whole batch, so they take it at once."""
    n = cfg.rollout.group_size
    if cfg.algorithm.name in ("grpo", "dapo"):
        return max(n, (cfg.train.infer_batch_size // n) * n)
    return cfg.global_batch


def _token_kl(cfg: Config, data: TensorDict) -> torch.Tensor | None:
    if not kl_in_reward(cfg):
        return None
    return kl_penalty(data["old_log_prob"], data["ref_log_prob"], cfg.algorithm.kl_estimator)


def _gae(cfg: Config, data: TensorDict, kl: torch.Tensor | None) -> TensorDict:
    ppo = cfg.algorithm.ppo
    mask = data["response_mask"]
    token_rewards = outcome_token_rewards(data["rewards"], mask, kl, cfg.algorithm.kl_coef)
    adv, ret = gae_advantages(token_rewards, data["values"], mask, ppo.gamma, ppo.lam, whiten=ppo.whiten_advantages)
    return TensorDict({"advantages": adv, "returns": ret}, batch_size=[len(mask)])


def compute_advantages(
    cfg: Config, data: TensorDict, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, TensorDict]:
    """(positions in ``data`` that get advantages, their output columns). Only PF-PPO drops positions."""
    alg = cfg.algorithm
    n = cfg.rollout.group_size
    mask = data["response_mask"]
    every = torch.arange(len(mask))
    kl = _token_kl(cfg, data)
    if alg.name in ("grpo", "dapo"):
        adv = grpo_advantages(data["rewards"], n, alg.norm_adv_by_std, alg.adv_eps)
        return every, TensorDict({"advantages": adv.unsqueeze(-1) * mask}, batch_size=[len(mask)])
    if alg.name == "ppo":
        return every, _gae(cfg, data, kl)
    if alg.name == "pf_ppo":
        pf = alg.pf_ppo
        kept = filter_by_reward(data["rewards"], n, pf.keep, pf.mode, generator=generator, temperature=pf.temperature)
        sub = data[kept]
        return kept, _gae(cfg, sub, None if kl is None else kl[kept])
    if alg.name in ("reinforce_pp", "reinforce_pp_baseline"):
        group = n if alg.name == "reinforce_pp_baseline" else None
        adv, _ = reinforce_pp_advantages(
            data["rewards"], mask, kl, alg.kl_coef, gamma=alg.reinforce_pp.gamma, group_size=group
        )
        return every, TensorDict({"advantages": adv}, batch_size=[len(mask)])
    raise ValueError(f"algorithm {alg.name!r} has no advantage state")
