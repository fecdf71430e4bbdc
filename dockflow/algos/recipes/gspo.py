"""GSPO (Zheng et al., 2025, "Group Sequence Policy Optimization"): GRPO's advantages with a sequence-level ratio.

One iteration: like GRPO (``recipes/grpo.py``), except the update. GSPO replaces the per-token importance ratio
with one per response, length-normalised,

    s_i = (pi(y_i | x) / pi_old(y_i | x)) ** (1 / |y_i|) = exp(mean_t [logp_t - old_logp_t]),

clips it at the sequence level to ``[1 - clip_eps, 1 + clip_eps_high]`` with the paper's tiny range (3e-4 and
4e-4, not PPO's 0.2: a length-normalised ratio moves little), and averages the clipped surrogate over the
responses of the mini-batch (each response counts once, whatever its length):

    loss = mean_i max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high))  (+ kl_coef x token-mean KL)

(``gspo_loss`` in ``algos/gspo.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.recipe import Algorithm, GroupNormSection
from dockflow.algos.recipes.grpo import group_normalised
from dockflow.config.base import Section

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config


class GSPOConfig(Section):
    """GSPO's upper sequence-level clip (the lower one is algorithm.clip_eps)."""

    clip_eps_high: float = Field(4e-4, gt=0.0, description="Upper clip of the sequence-level ratio (the paper: 4e-4).")


class GSPOSection(GroupNormSection):
    """GSPO: ``clip_eps`` is the lower clip of the sequence-level ratio (the paper: 3e-4)."""

    name: Literal["gspo"] = "gspo"
    clip_eps: float = Field(3e-4, gt=0.0, description="Lower clip of the sequence-level ratio (the paper: 3e-4).")
    gspo: GSPOConfig = Field(default_factory=GSPOConfig)


class GSPO(Algorithm):
    name = "gspo"
    section = GSPOSection

    def check(self, cfg: Config) -> None:
        if cfg.train.tis_cap is not None:
            raise ValueError("train.tis_cap weights tokens, but GSPO's importance ratio is per response: set tis_cap: null")

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        import torch

        return torch.arange(len(data)), group_normalised(cfg, data)

    def policy_loss(self, cfg: Config, logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        from dockflow.algos.gspo import gspo_loss
        from dockflow.algos.kl import kl_penalty
        from dockflow.algos.utils import masked_mean

        alg, mask = cfg.algorithm, micro["response_mask"]
        out = gspo_loss(logp, micro["old_log_prob"], micro["advantages"], mask, alg.clip_eps, alg.gspo.clip_eps_high,
                        sequences=cfg.train.mini_batch_size // cfg.train.dp)
        loss, kl_value = out["loss"], 0.0
        if self.kl_in_loss(cfg):
            kl_tok = kl_penalty(logp, micro["ref_log_prob"], alg.kl_estimator)
            loss = loss + alg.kl_coef * masked_mean(kl_tok, mask.to(logp.dtype), tokens)
            kl_value = float(masked_mean(kl_tok.detach(), mask.to(logp.dtype)))
        return loss, {"train/pg_loss": float(out["pg_loss"]), "train/kl": kl_value,
                      "train/clip_fraction": float(out["clip_fraction"]), "train/seq_ratio_mean": float(out["ratio_mean"]),
                      "train/loss": float(loss.detach())}
