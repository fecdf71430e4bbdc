"""DAPO (Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"): the
per-sample pieces that are not already in GRPO.

- Soft overlong punishment (Eq. 13): with ``L_max = max_length`` and ``L_cache = buffer_length``,

      R_length(y) = 0                                   if |y| <= L_max - L_cache
                  = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                  = -1                                  if L_max < |y|

  scaled by ``penalty`` and added to the task reward.
- Dynamic sampling: a group whose rewards are all equal has zero GRPO advantage and no gradient; DAPO
  over-samples and keeps only the informative groups.

The other two DAPO techniques live elsewhere: clip-higher is ``clip_eps_high`` of
:func:`dockflow.algos.grpo.clipped_policy_loss`, and its token-level loss is that function's token mean.
"""

from __future__ import annotations

import math

import torch


def overlong_penalty(response_length: torch.Tensor, max_length: int, buffer_length: int, penalty: float) -> torch.Tensor:
    """``[B]`` response lengths -> ``[B]`` length rewards in ``[-penalty, 0]`` (DAPO Eq. 13, times ``penalty``).

    0 up to ``max_length - buffer_length`` tokens, then linear down to ``-penalty`` at ``max_length``, and
    ``-penalty`` beyond. ``buffer_length=0`` is a step: 0 up to ``max_length``, ``-penalty`` beyond.
    """
    if not 0 <= buffer_length <= max_length:
        raise ValueError(f"buffer_length must be in [0, max_length={max_length}], got {buffer_length}")
    length = response_length.to(torch.get_default_dtype())
    over = length - (max_length - buffer_length)
    if buffer_length > 0:
        fraction = (over / buffer_length).clamp(0.0, 1.0)
    else:
        fraction = (over > 0).to(length.dtype)
    return -penalty * fraction


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[G*N]`` rewards laid out group by group -> ``[G]`` bool: True where a group's rewards differ.

    Dynamic sampling keeps the True groups (``0 < accuracy < 1`` for 0/1 rewards); NaN rewards (unscorable
    samples) do not count, so a group needs two different scored rewards. Use
    ``mask.repeat_interleave(group_size)`` for the per-sample mask.
    """
    if rewards.ndim != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, got {tuple(rewards.shape)}")
    grouped = rewards.view(-1, group_size)
    unscorable = torch.isnan(grouped)  # left out: a group needs two different scored rewards
    highest = torch.where(unscorable, -math.inf, grouped).amax(dim=1)
    lowest = torch.where(unscorable, math.inf, grouped).amin(dim=1)
    return highest > lowest
