"""GRPO (Shao et al., 2024, DeepSeekMath): group-relative advantages, no critic.

One iteration, stage by stage (``dockflow/flow/iteration.py``; in one process: ``flow/single_process.py``):

1. generate: N responses for each of G prompts into the iteration's dock window
   (``rollout/plain.py: generate_into_dock``).
2. infer: the reward worker scores every response with the task's verifier (``workers/reward.py``) and its
   advantage state (``workers/advantage.py``) computes advantages group by group: reward minus the group mean,
   divided by the group std (``advantages`` below: ``groups.py: group_normalised``, ``grpo_advantages``); the
   actor recomputes the old log-probs, and the reference worker its log-probs when ``kl_coef > 0``.
3. update: the clipped surrogate on the per-token ratio plus ``kl_coef`` x KL to the reference, a token-level
   mean over the mini-batch (``policy_loss`` below: ``losses.py: clipped_surrogate``, ``clipped_policy_loss``).
4. reshard: the new weights to the generation layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from dockflow.algos.base import Algorithm, GroupNormSection, policy_gradient_columns
from dockflow.algos.groups import group_normalised
from dockflow.algos.losses import clipped_surrogate

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config


class GRPOSection(GroupNormSection):
    """GRPO: the KL to the reference is a loss term (``kl_coef``, 0 in DeepSeekMath's R1 recipe follow-ups)."""

    name: Literal["grpo"] = "grpo"


class GRPO(Algorithm):
    name = "grpo"
    section = GRPOSection
    kl = "loss"  # kl_coef x KL to the reference is a term of the loss

    def consumers(self, cfg: Config) -> dict[str, list[str]]:
        """The on-line policy-gradient states: reward, advantage, actor (and reference with kl_coef > 0)."""
        return policy_gradient_columns(cfg, self)

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        """Every response gets its group-normalised reward, broadcast over its tokens."""
        return group_normalised(cfg, data)

    def policy_loss(self, cfg: Config, logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The symmetric clipped surrogate (``algorithm.clip_eps``), token-level mean over the mini-batch."""
        return clipped_surrogate(self, cfg, logp, micro, tokens)
