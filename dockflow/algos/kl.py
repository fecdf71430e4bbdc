"""KL estimators between the policy and the reference policy, per token (Schulman, "Approximating KL").

With ``log_ratio = logp - ref_logp`` sampled from the policy:
- k1 = log_ratio                          (unbiased, high variance, can be negative)
- k2 = log_ratio**2 / 2                   (biased, low variance)
- k3 = exp(-log_ratio) - 1 + log_ratio    (unbiased, always >= 0; GRPO's choice)
"""

from __future__ import annotations

from typing import Literal

import torch

KLEstimator = Literal["k1", "k2", "k3"]


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator = "k3") -> torch.Tensor:
    """Per-token KL estimate, same shape as ``logp``."""
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        # Clamp before exp so a far-off token cannot overflow to inf.
        neg = (-log_ratio).clamp(max=20.0)
        return torch.exp(neg) - 1.0 - neg
    raise ValueError(f"unknown KL estimator '{estimator}': use k1, k2 or k3")
