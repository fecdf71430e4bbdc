"""DAPO (Yu et al., 2025): GRPO with clip-higher, overlong reward shaping and dynamic sampling.

One iteration: like GRPO (``recipes/grpo.py``), except that

- with ``dynamic_sampling``, generate runs in up to ``max_rounds`` rounds (``sampling``): each round generates
  and scores G prompts, and the reward worker's advantage state gives advantages only to the groups
  ``DynamicSampling.select`` picks: informative ones (rewards not all equal) until the iteration has G of them,
  and on the last round any groups to fill the batch (``workers/advantage.py``,
  ``flow/iteration.py: RunTasks._sampling_rounds``);
- a response that reaches ``max_new_tokens`` loses up to ``overlong_penalty`` reward over the last
  ``overlong_buffer`` tokens (``shape_rewards``, ``algos/dapo.py: overlong_penalty``);
- the ratio clip is ``[1 - clip_eps, 1 + clip_eps_high]`` (clip-higher, ``clip_eps_high``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.plan import GroupSelection, Sampling
from dockflow.algos.recipe import Algorithm, GroupNormSection
from dockflow.algos.recipes.grpo import group_normalised
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


@dataclass(frozen=True)
class DynamicSampling:
    """DAPO's group selector (``GroupSelector``): informative groups first, uninformative ones only to fill the
    batch on the last round."""

    def select(self, rewards: torch.Tensor, group_size: int, wanted: int, last_round: bool) -> GroupSelection:
        """Up to ``wanted`` groups of the batch, in ascending position: the informative ones (rewards not all
        equal, ``algos/dapo.py: informative_groups``) first, then, on the last round, the others in order."""
        from dockflow.algos.dapo import informative_groups

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

    def sampling(self, cfg: Config) -> Sampling:
        """Dynamic sampling: up to ``max_rounds`` rounds of G prompts until G groups are selected."""
        dapo, g = cfg.algorithm.dapo, cfg.rollout.prompts_per_iter
        if not dapo.dynamic_sampling or dapo.max_rounds == 1:  # one round keeps every group: nothing to select
            return Sampling(rounds=1, quota=g)
        return Sampling(rounds=dapo.max_rounds, quota=g, selector=DynamicSampling())

    def clip_eps_high(self, cfg: Config) -> float | None:
        return cfg.algorithm.dapo.clip_eps_high

    def shape_rewards(self, cfg: Config, scores: torch.Tensor, response_length: torch.Tensor) -> torch.Tensor:
        dapo = cfg.algorithm.dapo
        if dapo.overlong_buffer == 0:
            return scores
        from dockflow.algos.dapo import overlong_penalty

        return scores + overlong_penalty(response_length, cfg.rollout.max_new_tokens, dapo.overlong_buffer,
                                         dapo.overlong_penalty)

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        import torch

        return torch.arange(len(data)), group_normalised(cfg, data)
