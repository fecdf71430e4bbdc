"""``train.rollout_correction``: the policy loss weighted against the generating engine's log-probs (TRL's
``vllm_importance_sampling_*``, verl's ``algorithm.rollout_correction``; docs/algorithms.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from dockflow.config.base import Section

RolloutCorrectionMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "geometric_mask"]


class RolloutCorrectionConfig(Section):
    """Rollout correction: weight or mask each response's policy loss by the ratio of the trainer's old policy
    (old_log_prob) to the behaviour policy that sampled it (the generator's rollout_log_prob), as TRL's
    vllm_importance_sampling_*, verl's algorithm.rollout_correction and OpenRLHF's is_correction_type do
    (dockflow/algos/rollout_correction.py; docs/algorithms.md, Rollout correction)."""

    mode: RolloutCorrectionMode | None = Field(
        None,
        description="null = off. token_truncate: each token weighted by its ratio clipped to [lower, cap] (TRL "
        "token_truncate, verl rollout_is: token, OpenRLHF tis); token_mask: the ratio, 0 where it is outside "
        "[lower, cap] (TRL token_mask, OpenRLHF icepop); sequence_truncate: every token of a response weighted by "
        "the response's ratio exp(sum of token log-ratios) clipped to [lower, cap] (TRL sequence_truncate, verl "
        "rollout_is: sequence); sequence_mask: that ratio, 0 for a response outside [lower, cap] (TRL sequence_mask, "
        "verl rollout_rs: sequence); geometric_mask: weight 1, 0 for a response whose geometric-mean ratio "
        "exp(mean token log-ratio) is outside [lower, cap] (verl rollout_rs: geometric, SkyRL's geometric mask).",
    )
    cap: float = Field(
        2.0,
        gt=0.0,
        description="Upper threshold of the ratio: truncate modes clip at it, mask modes drop above it (TRL "
        "vllm_importance_sampling_clip_max, verl rollout_is_threshold / rollout_rs_threshold, OpenRLHF's high "
        "threshold). geometric_mask wants it close to 1 (verl suggests 1.0002-1.001).",
    )
    lower: float | None = Field(
        None,
        gt=0.0,
        description="Lower threshold of the ratio, below cap: truncate modes clip at it, mask modes drop below it "
        "(TRL vllm_importance_sampling_clip_min, verl rollout_rs_threshold_lower, OpenRLHF's low threshold). null = "
        "no lower bound (TRL's default; verl's mask default is 1 / cap: write it).",
    )

    @model_validator(mode="after")
    def _lower_below_cap(self) -> RolloutCorrectionConfig:
        if self.lower is not None and self.lower >= self.cap:
            raise ValueError(f"train.rollout_correction.lower={self.lower:g} must be below cap={self.cap:g}")
        return self
