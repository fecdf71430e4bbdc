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
"""

from __future__ import annotations

import math
from typing import Literal

import torch

FilterMode = Literal["best_worst", "best", "worst", "reward_weighted"]
_ABOVE_ANY_REWARD = torch.finfo(torch.float64).max  # an unscored response's rank key where low rewards are kept


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
    worst_key = torch.where(unscored, _ABOVE_ANY_REWARD, grouped)  # unscored rank just above the lowest kept
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
