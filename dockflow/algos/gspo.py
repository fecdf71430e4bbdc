"""GSPO (Zheng et al., 2025, "Group Sequence Policy Optimization"): GRPO's advantages with a sequence-level ratio.

One iteration: like GRPO (``grpo.py``), except the update. GSPO replaces the per-token importance ratio
with one per response, length-normalised,

    s_i = (pi(y_i | x) / pi_old(y_i | x)) ** (1 / |y_i|) = exp(mean_t [logp_t - old_logp_t]),

clips it at the sequence level to ``[1 - clip_eps, 1 + clip_eps_high]`` with the paper's tiny range (3e-4 and
4e-4, not PPO's 0.2: a length-normalised ratio moves little), and averages the clipped surrogate over the
responses of the mini-batch (each response counts once, whatever its length):

    loss = mean_i max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high))  (+ kl_coef x token-mean KL)

(``gspo_loss`` below; the clip is ``losses.py: clipped_ratio``). Advantages are GRPO's (``groups.py:
group_normalised``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.base import Algorithm, GroupNormSection, policy_gradient_columns
from dockflow.algos.groups import group_normalised
from dockflow.algos.losses import clipped_ratio
from dockflow.algos.rollout_correction import SEQUENCE_MODES
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


def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
              clip_low: float, clip_high: float, sequences: float | None = None, *,
              sequence_weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """GSPO's clipped surrogate on [B, R] token tensors. ``advantages`` is per token (a response's value broadcast
    over its tokens) or per response [B]; ``sequences``: responses in the whole mini-batch when this call sees a
    micro-batch of it (default: this call's). A response without tokens (masked out) adds nothing.
    ``sequence_weights`` [B] (no grad) scale each response's term (a sequence-level rollout correction).
    Returns ``loss`` (with grad), and ``pg_loss``, ``clip_fraction``, ``ratio_mean``, ``log_ratio`` (no grad)."""
    import torch

    mask = response_mask.to(logp.dtype)
    lengths = mask.sum(-1)
    live = (lengths > 0).to(logp.dtype)
    mean_log_ratio = ((logp - old_logp) * mask).sum(-1) / lengths.clamp(min=1.0)
    ratio = torch.exp(mean_log_ratio.clamp(-20.0, 20.0))
    adv = advantages if advantages.ndim == 1 else (advantages * mask).sum(-1) / lengths.clamp(min=1.0)
    unclipped = -adv * ratio
    clipped = -adv * clipped_ratio(ratio, clip_low, clip_high)
    per_seq = torch.maximum(unclipped, clipped) * live
    if sequence_weights is not None:
        per_seq = per_seq * sequence_weights
    denom = float(sequences) if sequences is not None else max(float(live.sum()), 1.0)
    with torch.no_grad():
        n = max(float(live.sum()), 1.0)
        stats = {"pg_loss": per_seq.sum() / n, "clip_fraction": ((clipped > unclipped).to(logp.dtype) * live).sum() / n,
                 "ratio_mean": (ratio * live).sum() / n, "log_ratio": mean_log_ratio.detach()}
    return {"loss": per_seq.sum() / denom, **stats}


class GSPO(Algorithm):
    name = "gspo"
    section = GSPOSection
    kl = "loss"

    def check(self, cfg: Config) -> None:
        mode = cfg.train.rollout_correction.mode
        if mode is not None and mode not in SEQUENCE_MODES:
            raise ValueError(f"train.rollout_correction.mode={mode} weights tokens, but GSPO's importance ratio is per "
                             f"response: use one of {', '.join(SEQUENCE_MODES)}, or null")

    def consumers(self, cfg: Config) -> dict[str, list[str]]:
        return policy_gradient_columns(cfg, self)

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        return group_normalised(cfg, data)

    def policy_loss(self, cfg: Config, logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        """``gspo_loss`` over the rank's responses of the mini-batch, plus ``kl_coef`` x the token-mean KL."""
        from dockflow.algos.kl import kl_penalty
        from dockflow.algos.rollout_correction import micro_batch_correction
        from dockflow.algos.utils import masked_mean

        alg, mask = cfg.algorithm, micro["response_mask"]
        corr = micro_batch_correction(cfg, micro)
        out = gspo_loss(logp, micro["old_log_prob"], micro["advantages"], mask, alg.clip_eps, alg.gspo.clip_eps_high,
                        sequences=cfg.train.mini_batch_size // cfg.train.dp,
                        sequence_weights=None if corr is None else corr.sequence_weights)
        loss, kl_value = out["loss"], 0.0
        if self.kl_in_loss(cfg):
            kl_tok = kl_penalty(logp, micro["ref_log_prob"], alg.kl_estimator)
            loss = loss + alg.kl_coef * masked_mean(kl_tok, mask.to(logp.dtype), tokens)
            kl_value = float(masked_mean(kl_tok.detach(), mask.to(logp.dtype)))
        metrics = {"train/pg_loss": float(out["pg_loss"]), "train/kl": kl_value,
                   "train/clip_fraction": float(out["clip_fraction"]), "train/seq_ratio_mean": float(out["ratio_mean"]),
                   "train/loss": float(loss.detach())}
        return loss, {**metrics, **(corr.metrics if corr is not None else {})}
