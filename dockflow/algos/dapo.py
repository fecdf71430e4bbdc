"""DAPO (Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"): GRPO with
clip-higher, overlong reward shaping and dynamic sampling.

One iteration: like GRPO (``grpo.py``), except that

- with ``dynamic_sampling``, generate runs in up to ``max_rounds`` rounds (``sampling``): each round generates
  and scores G prompts, and the reward worker's advantage state gives advantages only to the groups
  ``DynamicSampling.select`` picks: informative ones (rewards not all equal, ``groups.py: informative_groups``)
  until the iteration has G of them, and on the last round any groups to fill the batch
  (``workers/advantage.py``, ``flow/iteration.py: RunTasks._sampling_rounds``);
- a response that reaches ``max_new_tokens`` loses up to ``overlong_penalty`` reward over the last
  ``overlong_buffer`` tokens (``shape_rewards``, ``overlong_penalty`` below, the paper's Eq. 13):

      R_length(y) = 0                                   if |y| <= L_max - L_cache
                  = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                  = -1                                  if L_max < |y|

  scaled by ``penalty`` and added to the task reward;
- the ratio clip is ``[1 - clip_eps, 1 + clip_eps_high]`` (clip-higher, ``policy_loss``: ``losses.py:
  clipped_surrogate``), and the loss is its token-level mean.

Advantages are GRPO's (``groups.py: group_normalised``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.base import Algorithm, GroupNormSection, policy_gradient_columns
from dockflow.algos.groups import group_normalised, informative_groups
from dockflow.algos.losses import clipped_surrogate
from dockflow.algos.plan import GroupSelection, Sampling
from dockflow.config.base import Section

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config


class DAPOConfig(Section):
    """DAPO's own knobs (the paper's values)."""

    clip_eps_high: float = Field(0.28, gt=0.0, description="Upper ratio clip (clip-higher); algorithm.clip_eps is the lower.")
    overlong_buffer: int = Field(2, ge=0, description="Tokens before max_new_tokens where the overlong penalty ramps up (0 = off).")
    overlong_penalty: float = Field(1.0, ge=0.0, description="Reward subtracted from a response that hits max_new_tokens.")
    dynamic_sampling: bool = Field(True, description="Drop groups whose rewards are all equal and sample more prompts.")
    max_rounds: int = Field(3, ge=1, description="Generation rounds per iteration at most; the last round fills the batch.")


class DAPOSection(GroupNormSection):
    """DAPO: ``clip_eps`` is the lower ratio clip."""

    name: Literal["dapo"] = "dapo"
    dapo: DAPOConfig = Field(default_factory=DAPOConfig)


def overlong_penalty(response_length: torch.Tensor, max_length: int, buffer_length: int, penalty: float) -> torch.Tensor:
    """``[B]`` response lengths -> ``[B]`` length rewards in ``[-penalty, 0]`` (DAPO Eq. 13, times ``penalty``).

    0 up to ``max_length - buffer_length`` tokens, then linear down to ``-penalty`` at ``max_length``, and
    ``-penalty`` beyond. ``buffer_length=0`` is a step: 0 up to ``max_length``, ``-penalty`` beyond.
    """
    import torch

    if not 0 <= buffer_length <= max_length:
        raise ValueError(f"buffer_length must be in [0, max_length={max_length}], got {buffer_length}")
    length = response_length.to(torch.get_default_dtype())
    over = length - (max_length - buffer_length)
    if buffer_length > 0:
        fraction = (over / buffer_length).clamp(0.0, 1.0)
    else:
        fraction = (over > 0).to(length.dtype)
    return -penalty * fraction


@dataclass(frozen=True)
class DynamicSampling:
    """DAPO's group selector (``GroupSelector``): informative groups first, uninformative ones only to fill the
    batch on the last round."""

    def select(self, rewards: torch.Tensor, group_size: int, wanted: int, last_round: bool) -> GroupSelection:
        """Up to ``wanted`` groups of the batch, in ascending position: the informative ones (rewards not all
        equal, ``groups.py: informative_groups``) first, then, on the last round, the others in order."""
        informative = informative_groups(rewards, group_size).tolist()
        order = [g for g, ok in enumerate(informative) if ok]
        if last_round:
            order += [g for g, ok in enumerate(informative) if not ok]
        take = sorted(order[: max(0, wanted)])
        return GroupSelection(groups=take, filled=sum(1 for g in take if not informative[g]))

    def metrics(self, kept: int, filled: int, rounds: int) -> dict[str, float]:
        return {"dapo/kept_groups": float(kept), "dapo/filled_groups": float(filled), "dapo/rounds": float(rounds)}


class DAPO(Algorithm):
    name = "dapo"
    section = DAPOSection
    kl = "loss"

    def sampling(self, cfg: Config) -> Sampling:
        """Dynamic sampling: up to ``max_rounds`` rounds of G prompts until G groups are selected."""
        dapo, g = cfg.algorithm.dapo, cfg.rollout.prompts_per_iter
        if not dapo.dynamic_sampling or dapo.max_rounds == 1:  # one round keeps every group: nothing to select
            return Sampling(rounds=1, quota=g)
        return Sampling(rounds=dapo.max_rounds, quota=g, selector=DynamicSampling())

    def consumers(self, cfg: Config) -> dict[str, list[str]]:
        """GRPO's states; in rounds, the actor's and the reference's inference read the selected groups only."""
        return policy_gradient_columns(cfg, self)

    def shape_rewards(self, cfg: Config, scores: torch.Tensor, response_length: torch.Tensor) -> torch.Tensor:
        dapo = cfg.algorithm.dapo
        if dapo.overlong_buffer == 0:
            return scores
        return scores + overlong_penalty(response_length, cfg.rollout.max_new_tokens, dapo.overlong_buffer,
                                         dapo.overlong_penalty)

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        return group_normalised(cfg, data)

    def policy_loss(self, cfg: Config, logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped surrogate with clip-higher: the ratio in ``[1 - clip_eps, 1 + dapo.clip_eps_high]``."""
        return clipped_surrogate(self, cfg, logp, micro, tokens, clip_eps_high=cfg.algorithm.dapo.clip_eps_high)
