"""The clipped ratio and the clipped surrogate policy loss, shared by the algorithms that name them.

- ``clipped_ratio``: ``clip(ratio, 1 - clip_low, 1 + clip_high)``, the one place the ratio's trust region is
  written (the per-token ratio here, GSPO's per-response ratio in ``dockflow.algos.gspo``; CISPO bounds its
  importance weight from above only, ``dockflow.algos.cispo``).
- ``clipped_policy_loss``: PPO's clipped surrogate on the per-token importance ratio against the behaviour policy,
  plus ``kl_coef`` times a KL estimate to the reference policy, averaged over all response tokens of the
  mini-batch (token-level mean). Clip-higher (DAPO, Yu et al., 2025): ``clip_eps_high`` decouples the upper bound
  of the ratio clip from the lower one, so low-probability tokens with a positive advantage can grow further.
- ``clipped_surrogate``: that loss on an actor micro-batch under a config, with the rollout correction's token
  weights (``train.rollout_correction``) and the metrics the actor logs: the policy loss of GRPO, PPO, DAPO, PF-PPO, RLOO,
  REINFORCE++ and Dr. GRPO.

Light at import: torch is imported inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.algos.base import Algorithm
    from dockflow.algos.kl import KLEstimator
    from dockflow.config import Config


def clipped_ratio(ratio: torch.Tensor, clip_low: float, clip_high: float) -> torch.Tensor:
    """``ratio`` clipped to ``[1 - clip_low, 1 + clip_high]``."""
    return ratio.clamp(1.0 - clip_low, 1.0 + clip_high)


def token_kl(logp: torch.Tensor, ref_logp: torch.Tensor | None, kl_coef: float,
             kl_estimator: KLEstimator) -> torch.Tensor:
    """The per-token KL estimate to the reference that a loss adds ``kl_coef`` times (zeros when ``kl_coef`` is 0)."""
    import torch

    from dockflow.algos.kl import kl_penalty

    if kl_coef <= 0.0:
        return torch.zeros_like(logp)
    if ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp (the reference worker's log-probs)")
    return kl_penalty(logp, ref_logp, kl_estimator)


@dataclass
class PolicyLossOutput:
    loss: torch.Tensor
    pg_loss: torch.Tensor
    kl: torch.Tensor
    clip_fraction: torch.Tensor
    approx_kl_old: torch.Tensor


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    token_denom: float | None = None,
    clip_eps_high: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """The clipped surrogate on [B, R] token tensors; ``advantages`` is per sample [B] or per token [B, R].

    The ratio is clipped to ``[1 - clip_eps, 1 + clip_eps_high]``; ``clip_eps_high=None`` means
    ``clip_eps`` (the symmetric PPO clip). ``token_weights`` [B, R] (no grad) scale each token's policy term,
    e.g. the rollout correction's weights against the behaviour policy (``dockflow.algos.rollout_correction``).

    ``token_denom`` is the number of response tokens in the whole mini-batch when this call sees one
    micro-batch of it, so that summed micro-batch gradients equal the mini-batch token-level mean.
    """
    import torch

    from dockflow.algos.utils import masked_mean

    mask = response_mask.to(logp.dtype)
    adv = advantages.unsqueeze(-1) if advantages.ndim == 1 else advantages
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
    unclipped = -adv * ratio
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    clipped = -adv * clipped_ratio(ratio, clip_eps, eps_high)
    pg_tok = torch.maximum(unclipped, clipped)
    if token_weights is not None:
        pg_tok = pg_tok * token_weights
    kl_tok = token_kl(logp, ref_logp, kl_coef, kl_estimator)
    loss = masked_mean(pg_tok + kl_coef * kl_tok, mask, token_denom)
    # Reported values are means over this call's tokens, whatever token_denom is.
    with torch.no_grad():
        pg_loss = masked_mean(pg_tok, mask)
        kl = masked_mean(kl_tok, mask)
        clip_fraction = masked_mean((clipped > unclipped).to(logp.dtype), mask)
        approx_kl_old = masked_mean(0.5 * log_ratio.square(), mask)
    return PolicyLossOutput(loss, pg_loss, kl, clip_fraction, approx_kl_old)


def clipped_surrogate(recipe: Algorithm, cfg: Config, logp: torch.Tensor, micro: TensorDict, tokens: float,
                      clip_eps_high: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """``clipped_policy_loss`` on an actor micro-batch (``tokens``: the loss's denominator, the mini-batch's
    response tokens), its KL term when ``recipe`` puts the KL in the loss, ``train.rollout_correction``'s weights;
    and the actor's metrics. ``clip_eps_high``: the upper ratio clip (None: ``algorithm.clip_eps``)."""
    from dockflow.algos.rollout_correction import micro_batch_correction

    alg, kl = cfg.algorithm, recipe.kl_in_loss(cfg)
    corr = micro_batch_correction(cfg, micro)
    out = clipped_policy_loss(
        logp, micro["old_log_prob"], micro["advantages"], micro["response_mask"], clip_eps=alg.clip_eps,
        clip_eps_high=clip_eps_high, ref_logp=micro["ref_log_prob"] if kl else None,
        kl_coef=alg.kl_coef if kl else 0.0, kl_estimator=alg.kl_estimator, token_denom=tokens,
        token_weights=None if corr is None else corr.weights,
    )
    metrics = {
        "train/pg_loss": float(out.pg_loss), "train/kl": float(out.kl), "train/clip_fraction": float(out.clip_fraction),
        "train/approx_kl_old": float(out.approx_kl_old),
        "train/loss": float(out.loss.detach()) * tokens / max(float(micro["response_mask"].sum()), 1.0),
    }
    if corr is not None:
        metrics.update(corr.metrics)
    return out.loss, metrics
