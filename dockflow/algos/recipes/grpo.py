"""GRPO (Shao et al., 2024, DeepSeekMath): group-relative advantages, no critic.

One iteration, stage by stage (``dockflow/flow/iteration.py``):

1. generate: N responses for each of G prompts into the iteration's dock window (``rollout/plain.py``).
2. infer: the reward worker scores every response with the task's verifier (``workers/reward.py``) and its
   advantage state (``workers/advantage.py``) computes advantages group by group: reward minus the group mean, divided by the group std
   (``advantages`` below, ``algos/grpo.py: grpo_advantages``); the actor recomputes the old log-probs, and the
   reference worker its log-probs when ``kl_coef > 0``.
3. update: the clipped surrogate on the per-token ratio plus ``kl_coef`` x KL to the reference, a token-level
   mean over the mini-batch (``Algorithm.policy_loss``, ``algos/grpo.py: clipped_policy_loss``).
4. reshard: the new weights to the generation layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from dockflow.algos.recipe import Algorithm, GroupNormSection

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config


class GRPOSection(GroupNormSection):
    """GRPO: the KL to the reference is a loss term (``kl_coef``, 0 in DeepSeekMath's R1 recipe follow-ups)."""

    name: Literal["grpo"] = "grpo"


def group_normalised(cfg: Config, data: TensorDict) -> TensorDict:
    """Sequence-level group-normalised advantages, broadcast over the response tokens."""
    from tensordict import TensorDict

    from dockflow.algos.grpo import grpo_advantages

    alg, mask = cfg.algorithm, data["response_mask"]
    adv = grpo_advantages(data["rewards"], cfg.rollout.group_size, alg.norm_adv_by_std, alg.adv_eps)
    return TensorDict({"advantages": adv.unsqueeze(-1) * mask}, batch_size=[len(mask)])


class GRPO(Algorithm):
    name = "grpo"
    section = GRPOSection

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        import torch

        return torch.arange(len(data)), group_normalised(cfg, data)
