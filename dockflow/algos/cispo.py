"""CISPO (MiniMax, 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention"): clip the
importance-sampling weight, not the update.

PPO's clip (GRPO, DAPO) drops the gradient of every token whose ratio left the trust region: rare tokens that
start a reflection ("However", "Wait") are clipped away after the first update. CISPO keeps every token's
gradient and bounds its importance-sampling weight instead, as TRL 1.16 does with ``loss_type="cispo"``
(``trl/trainer/grpo_trainer.py``, ``GRPOTrainer._compute_loss``):

    w_t   = min(pi(y_t) / pi_old(y_t), epsilon_high)   detached (TRL: torch.clamp(coef_1, max=epsilon_high).detach())
    loss  = sum_t -w_t * A * log pi(y_t) / (response tokens of the mini-batch)   (+ kl_coef x KL, a loss term)

a REINFORCE-style term weighted by the truncated weight, normalised over the mini-batch's response tokens (TRL:
``num_items_in_batch``). ``epsilon_high`` is the weight's upper bound itself (ScaleRL's epsilon_max; TRL's
recommended value for cispo, 5.0), not ``1 + epsilon``; there is no lower bound.

One iteration is GRPO's (``grpo.py``) with this loss (``cispo_loss``, ``policy_loss`` below): group-normalised
advantages (``groups.py: group_normalised``), the policy-gradient states (``base.py: policy_gradient_columns``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.base import Algorithm, policy_gradient_columns
from dockflow.algos.groups import group_normalised
from dockflow.algos.losses import PolicyLossOutput, token_kl
from dockflow.config.algorithm import AlgorithmSection
from dockflow.config.base import Section

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.algos.kl import KLEstimator
    from dockflow.config import Config


class CISPOConfig(Section):
    """CISPO's bound on the importance-sampling weight."""

    epsilon_high: float = Field(
        5.0, gt=0.0, description="Upper bound of the detached importance-sampling weight pi/pi_old (TRL's epsilon_high "
        "with loss_type='cispo': the weight itself, not 1 + epsilon; ScaleRL's recommended 5.0)."
    )


class CISPOSection(AlgorithmSection):
    """CISPO: GRPO's advantages and KL term; no ratio clip (``cispo.epsilon_high`` bounds the weight instead)."""

    name: Literal["cispo"] = "cispo"
    kl_coef: float = Field(0.0, ge=0.0, description="KL to the reference policy, a loss term (0: no reference worker).")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator (Schulman's k1/k2/k3).")
    norm_adv_by_std: bool = Field(True, description="Divide group-centred rewards by the group std.")
    adv_eps: float = Field(1e-6, gt=0.0, description="Added to the std when normalising advantages.")
    cispo: CISPOConfig = Field(default_factory=CISPOConfig)


def cispo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    epsilon_high: float = 5.0,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    token_denom: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """CISPO's loss on [B, R] token tensors; ``advantages`` is per sample [B] or per token [B, R].

    ``-min(ratio, epsilon_high).detach() * A * logp`` per token (times ``token_weights``, e.g. the rollout
    correction's weights), plus ``kl_coef`` x the KL estimate; the sum over real tokens divided by
    ``token_denom`` (the mini-batch's response tokens when this call sees one micro-batch of it; default this
    call's). ``clip_fraction`` is the share of
    tokens whose weight was truncated with a positive advantage (TRL's ``cispo_clip_ratio``)."""
    import torch

    from dockflow.algos.utils import masked_mean

    mask = response_mask.to(logp.dtype)
    adv = advantages.unsqueeze(-1) if advantages.ndim == 1 else advantages
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
    weight = ratio.clamp(max=epsilon_high).detach()  # the truncated importance-sampling weight
    pg_tok = -weight * adv * logp
    if token_weights is not None:
        pg_tok = pg_tok * token_weights
    kl_tok = token_kl(logp, ref_logp, kl_coef, kl_estimator)
    loss = masked_mean(pg_tok + kl_coef * kl_tok, mask, token_denom)
    with torch.no_grad():
        clipped = ((ratio > epsilon_high) & (adv > 0)).to(logp.dtype)
        return PolicyLossOutput(loss, masked_mean(pg_tok, mask), masked_mean(kl_tok, mask), masked_mean(clipped, mask),
                                masked_mean(0.5 * log_ratio.square(), mask))


class CISPO(Algorithm):
    name = "cispo"
    section = CISPOSection
    kl = "loss"  # kl_coef x KL to the reference is a term of the loss

    def consumers(self, cfg: Config) -> dict[str, list[str]]:
        """The on-line policy-gradient states: reward, advantage, actor (and reference with kl_coef > 0)."""
        return policy_gradient_columns(cfg, self)

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        """Every response gets its group-normalised reward, broadcast over its tokens (GRPO's)."""
        return group_normalised(cfg, data)

    def policy_loss(self, cfg: Config, logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        """``cispo_loss`` over the mini-batch's response tokens, with ``train.rollout_correction``'s weights."""
        from dockflow.algos.rollout_correction import micro_batch_correction

        alg, kl = cfg.algorithm, self.kl_in_loss(cfg)
        corr = micro_batch_correction(cfg, micro)
        out = cispo_loss(logp, micro["old_log_prob"], micro["advantages"], micro["response_mask"],
                         epsilon_high=alg.cispo.epsilon_high, ref_logp=micro["ref_log_prob"] if kl else None,
                         kl_coef=alg.kl_coef if kl else 0.0, kl_estimator=alg.kl_estimator, token_denom=tokens,
                         token_weights=None if corr is None else corr.weights)
        metrics = {
            "train/pg_loss": float(out.pg_loss), "train/kl": float(out.kl), "train/clip_fraction": float(out.clip_fraction),
            "train/approx_kl_old": float(out.approx_kl_old),
            "train/loss": float(out.loss.detach()) * tokens / max(float(micro["response_mask"].sum()), 1.0),
        }
        if corr is not None:
            metrics.update(corr.metrics)
        return out.loss, metrics
