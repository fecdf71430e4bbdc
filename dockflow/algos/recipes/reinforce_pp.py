"""REINFORCE++ (Hu, 2025): critic-free, with the KL in the token rewards and batch-normalised returns.

One iteration:

1. generate: N responses per prompt.
2. infer: the verifier's reward on each response's last token, minus ``kl_coef`` x the per-token KL to the
   reference; discounted returns (``gamma``), normalised over the whole batch (``algos/reinforce_pp.py``).
   The ``-baseline`` variant first subtracts each group's mean reward (for N > 1). Old and reference log-probs.
3. update: the clipped surrogate on the per-token ratio, no KL term in the loss.
4. reshard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.recipe import Algorithm, PolicyGradientSection
from dockflow.config.base import Section

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config


class ReinforcePPConfig(Section):
    """REINFORCE++'s return."""

    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount over response tokens.")


class ReinforcePPSection(PolicyGradientSection):
    """REINFORCE++ and REINFORCE++-baseline: ``kl_coef`` is a per-token reward penalty."""

    name: Literal["reinforce_pp", "reinforce_pp_baseline"] = "reinforce_pp"
    reinforce_pp: ReinforcePPConfig = Field(default_factory=ReinforcePPConfig)


class ReinforcePP(Algorithm):
    name = "reinforce_pp"
    section = ReinforcePPSection
    kl = "reward"
    group_advantages = False  # returns are normalised over the batch
    group_baseline = False

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        import torch
        from tensordict import TensorDict

        from dockflow.algos.reinforce_pp import reinforce_pp_advantages

        alg, mask = cfg.algorithm, data["response_mask"]
        group = cfg.rollout.group_size if self.group_baseline else None
        adv, _ = reinforce_pp_advantages(data["rewards"], mask, self.token_kl(cfg, data), alg.kl_coef,
                                         gamma=alg.reinforce_pp.gamma, group_size=group)
        return torch.arange(len(mask)), TensorDict({"advantages": adv}, batch_size=[len(mask)])


class ReinforcePPBaseline(ReinforcePP):
    name = "reinforce_pp_baseline"
    group_baseline = True
