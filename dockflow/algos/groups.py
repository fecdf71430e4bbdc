"""Groups of N responses to one prompt: group-normalised advantages and the informative-group filter, written once
for every algorithm that names them.

- ``grpo_advantages`` (Shao et al., 2024, DeepSeekMath): a response's advantage is its reward minus the group
  mean, divided by the group std (``norm_by_std``; Dr. GRPO leaves the std out). REINFORCE++-baseline uses it
  without the std as its group baseline.
- ``group_normalised``: those advantages from a config and a scored batch, broadcast over the response tokens:
  the advantage state of GRPO, DAPO, GSPO, Dr. GRPO and CISPO.
- ``informative_groups``: whether a group's rewards differ. A group whose rewards are all equal has zero
  group-relative advantage and no gradient; DAPO's dynamic sampling keeps only the informative groups
  (``dockflow.algos.dapo.DynamicSampling``), and the advantage state reports the share of them for every algorithm
  (``dockflow.workers.advantage``).

Light at import: torch is imported inside the functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config


def grpo_advantages(
    rewards: torch.Tensor, group_size: int, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Per-sample advantages from per-sample rewards laid out group by group ([G*N] -> [G*N]).

    A group whose rewards are all equal carries no signal and gets advantage 0 for every member. A NaN reward
    (a sample no reward applies to) is left out of its group's mean and std and gets advantage 0, as TRL does.
    """
    from dockflow.algos.utils import group_mean_std, zero_nan

    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, got {tuple(rewards.shape)}")
    grouped = rewards.float().view(-1, group_size)
    mean, std = group_mean_std(grouped)
    centred = grouped - mean
    if norm_by_std and group_size > 1:
        centred = centred / (std + eps)
    return zero_nan(centred).reshape(-1)


def group_normalised(cfg: Config, data: TensorDict) -> tuple[torch.Tensor, TensorDict]:
    """Every position of ``data`` and its sequence-level group-normalised advantages (``grpo_advantages`` with
    ``algorithm.norm_adv_by_std`` and ``algorithm.adv_eps``), broadcast over the response tokens."""
    import torch
    from tensordict import TensorDict

    alg, mask = cfg.algorithm, data["response_mask"]
    adv = grpo_advantages(data["rewards"], cfg.rollout.group_size, alg.norm_adv_by_std, alg.adv_eps)
    return torch.arange(len(data)), TensorDict({"advantages": adv.unsqueeze(-1) * mask}, batch_size=[len(mask)])


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[G*N]`` rewards laid out group by group -> ``[G]`` bool: True where a group's rewards differ.

    Dynamic sampling keeps the True groups (``0 < accuracy < 1`` for 0/1 rewards); NaN rewards (unscorable
    samples) do not count, so a group needs two different scored rewards. Use
    ``mask.repeat_interleave(group_size)`` for the per-sample mask.
    """
    import math

    import torch

    if rewards.ndim != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, got {tuple(rewards.shape)}")
    grouped = rewards.view(-1, group_size)
    unscorable = torch.isnan(grouped)  # left out: a group needs two different scored rewards
    highest = torch.where(unscorable, -math.inf, grouped).amax(dim=1)
    lowest = torch.where(unscorable, math.inf, grouped).amin(dim=1)
    return highest > lowest
