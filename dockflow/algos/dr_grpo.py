"""Dr. GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"): GRPO, unbiased.

The paper finds two biases in GRPO's objective and removes both; one iteration is otherwise GRPO's
(``grpo.py``):

- difficulty bias: dividing a group's centred rewards by the group's std weighs questions that are nearly always
  right or nearly always wrong more. Dr. GRPO's advantage is the reward minus the group mean
  (``norm_adv_by_std`` is false by default; ``groups.py: group_normalised``);
- length bias: dividing each response's loss by its own length (or a batch's by the tokens it generated)
  shrinks the per-token gradient of long responses, so long wrong answers are punished less. Dr. GRPO sums the
  clipped surrogate over the mini-batch's response tokens and divides by a constant: the mini-batch's responses
  x ``rollout.max_new_tokens`` (TRL's ``loss_type="dr_grpo"``; ``losses.py: clipped_surrogate``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.base import Algorithm, GroupNormSection, policy_gradient_columns
from dockflow.algos.groups import group_normalised
from dockflow.algos.losses import clipped_surrogate

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config


class DrGRPOSection(GroupNormSection):
    """Dr. GRPO: GRPO's knobs, with the group std left out of the advantage by default."""

    name: Literal["dr_grpo"] = "dr_grpo"
    norm_adv_by_std: bool = Field(False, description="Divide group-centred rewards by the group std (Dr. GRPO: no).")


class DrGRPO(Algorithm):
    name = "dr_grpo"
    section = DrGRPOSection
    kl = "loss"

    def consumers(self, cfg: Config) -> dict[str, list[str]]:
        return policy_gradient_columns(cfg, self)

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        """Group-centred rewards (divided by the std only with ``norm_adv_by_std``)."""
        return group_normalised(cfg, data)

    def policy_loss(self, cfg: Config, logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        """GRPO's clipped surrogate over a constant: the mini-batch's responses x the generation budget."""
        return clipped_surrogate(self, cfg, logp, micro, self.loss_denominator(cfg))

    def loss_denominator(self, cfg: Config) -> float:
        return float(cfg.train.mini_batch_size * cfg.rollout.max_new_tokens)
