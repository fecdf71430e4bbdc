"""Rollout correction: weights that correct the policy loss for the gap between the behaviour policy that
sampled the tokens and the trainer's old policy (``train.rollout_correction``).

The generation engine (vLLM, or a generator worker holding older weights) samples from a slightly different
distribution than the one the trainer's ``old_log_prob`` describes. Each response token's loss is multiplied
by a weight built from the ratio ``exp(old_log_prob - rollout_log_prob)``:

- ``token_truncate``: the token's ratio clipped to ``[lower, cap]`` (TIS, Yao et al., 2025);
- ``token_mask``: the token's ratio, 0 outside ``[lower, cap]`` (IcePop);
- ``sequence_truncate``: the response's ratio ``exp(sum_t log-ratio_t)`` clipped to ``[lower, cap]``;
- ``sequence_mask``: that ratio, 0 for a response outside ``[lower, cap]``;
- ``geometric_mask``: 1, 0 for a response whose geometric-mean ratio ``exp(mean_t log-ratio_t)`` is outside
  ``[lower, cap]`` (rejection only, no reweighting).

``lower=None`` is no lower bound. Log-ratios are clamped to [-20, 20] before ``exp`` (tokens or responses);
padding weighs 0. The weights carry no gradient. Light at import: torch is imported inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config
    from dockflow.config.correction import RolloutCorrectionConfig

SEQUENCE_MODES = ("sequence_truncate", "sequence_mask", "geometric_mask")
LOG_RATIO_BOUND = 20.0


@dataclass
class RolloutCorrection:
    """The weights of one micro-batch and their statistics (``train/rollout_is_*``)."""

    weights: torch.Tensor  # [B, R], detached; 0 at padding; a sequence mode's weight repeated over its tokens
    sequence_weights: torch.Tensor | None  # [B] for the sequence modes (GSPO weighs responses), else None
    metrics: dict[str, float]


def rollout_correction(old_logp: torch.Tensor, rollout_logp: torch.Tensor, response_mask: torch.Tensor,
                       settings: RolloutCorrectionConfig) -> RolloutCorrection:
    """``settings.mode``'s weights on [B, R] tensors (``old_logp``: the trainer's old policy, ``rollout_logp``:
    the generator's), and metrics over the response's tokens (token modes) or responses (sequence modes)."""
    import torch

    if settings.mode is None:
        raise ValueError("train.rollout_correction.mode is null: there is no correction to compute")
    with torch.no_grad():
        mask = response_mask.bool()
        log_ratio = torch.where(mask, (old_logp - rollout_logp).float(), 0.0)
        if settings.mode in SEQUENCE_MODES:
            lengths = mask.sum(-1)
            per_seq = log_ratio.sum(-1)
            if settings.mode == "geometric_mask":
                per_seq = per_seq / lengths.clamp(min=1)
            ratio, valid = torch.exp(per_seq.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)), lengths > 0
        else:
            ratio, valid = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)), mask
        weight, outside = _bounded(ratio, settings)
        if settings.mode in SEQUENCE_MODES:
            seq_weight = weight * valid
            tokens = seq_weight.unsqueeze(-1) * mask
        else:
            seq_weight, tokens = None, weight * mask
        metrics = _metrics(ratio[valid], outside[valid], tokens[mask], settings.mode.endswith("mask"))
    return RolloutCorrection(tokens, seq_weight, metrics)


def _bounded(ratio: torch.Tensor, settings: RolloutCorrectionConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight of each ratio under the mode, and where the ratio is outside ``[lower, cap]``."""
    low = 0.0 if settings.lower is None else settings.lower
    outside = (ratio > settings.cap) | (ratio < low)
    if settings.mode.endswith("truncate"):
        return ratio.clamp(min=low, max=settings.cap), outside
    keep = (~outside).float()
    return (keep if settings.mode == "geometric_mask" else ratio * keep), outside


def _metrics(ratio: torch.Tensor, outside: torch.Tensor, weights: torch.Tensor, masks: bool) -> dict[str, float]:
    """Ratio mean and max and the share outside the bounds over the valid units, the mean token weight (all 0
    without one: every micro-batch reports the same keys, which the data-parallel ranks sum)."""
    if ratio.numel() == 0:
        ratio = outside = weights = ratio.new_zeros(1)
    share = "train/rollout_is_masked_share" if masks else "train/rollout_is_truncated_share"
    return {
        "train/rollout_is_ratio_mean": float(ratio.mean()), "train/rollout_is_ratio_max": float(ratio.max()),
        share: float(outside.float().mean()), "train/rollout_is_weight_mean": float(weights.mean()),
    }


def micro_batch_correction(cfg: Config, micro: TensorDict) -> RolloutCorrection | None:
    """``train.rollout_correction`` on an actor micro-batch (its ``old_log_prob``, ``rollout_log_prob``,
    ``response_mask``); None when the mode is null."""
    settings = cfg.train.rollout_correction
    if settings.mode is None:
        return None
    return rollout_correction(micro["old_log_prob"], micro["rollout_log_prob"], micro["response_mask"], settings)
