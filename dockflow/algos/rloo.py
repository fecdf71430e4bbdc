"""RLOO's advantage (Ahmadian et al., 2024; the leave-one-out baseline of Kool et al., 2019): each reward minus
the mean reward of its group's other N - 1 responses. The recipe is ``dockflow.algos.recipes.rloo``."""

from __future__ import annotations

import torch

from dockflow.algos.utils import zero_nan


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[G*N]`` rewards, group by group -> each minus the mean of its group's other N - 1 rewards.

    A NaN reward (a sample no reward applies to) is in no baseline and gets advantage 0, as does a sample
    whose group has no other scored reward."""
    if rewards.ndim != 1 or group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D in groups of group_size={group_size} >= 2, got {tuple(rewards.shape)}")
    grouped = rewards.float().view(-1, group_size)
    scored = ~torch.isnan(grouped)
    values = torch.where(scored, grouped, 0.0)
    others = (values.sum(dim=1, keepdim=True) - values) / (scored.sum(dim=1, keepdim=True) - 1)
    return zero_nan(torch.where(scored, values - others, float("nan"))).reshape(-1)
