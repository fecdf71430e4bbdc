"""DPO (Rafailov et al., 2023): offline preference pairs against the frozen reference; no rollouts, no reward.

One iteration:

1. generate: the pair source worker puts the iteration's (chosen, rejected) pairs into the dock window, chosen at
   even and rejected at odd indices (``workers/pairs.py``); pairs come from ``pairs_path`` or are built from the
   task (the right answer chosen, a near miss rejected; ``data/preferences.py``).
2. infer: the reference worker's log-probs of every row.
3. update: the DPO loss on sequence log-probs, pair by pair (``policy_loss``, ``algos/dpo.py: dpo_loss``); rows
   stay in pairs and in order (``paired_rows``).
4. reshard; evaluations add the policy's margin, chosen minus rejected, on held-out pairs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.recipe import ROLLOUT, Algorithm, AlgorithmSection, PreferenceSection

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config

MARGIN = "eval/preference_margin"  # what an evaluation with held-out pairs adds


class DPOConfig(PreferenceSection):
    """DPO's temperature and its pairs."""

    key = "algorithm.dpo"
    beta: float = Field(0.1, gt=0.0, description="Inverse temperature of the implicit reward.")
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5, description="Conservative DPO: assumed label-noise rate.")


class DPOSection(AlgorithmSection):
    """DPO: always against the reference policy (no kl_coef)."""

    name: Literal["dpo"] = "dpo"
    dpo: DPOConfig = Field(default_factory=DPOConfig)


class DPO(Algorithm):
    name = "dpo"
    section = DPOSection
    offline = True
    paired_rows = True

    def check(self, cfg: Config) -> None:
        if cfg.rollout.group_size != 2:
            raise ValueError("algorithm.name=dpo trains on (chosen, rejected) pairs: set rollout.group_size: 2")
        if cfg.train.micro_batch_size % 2 or cfg.train.mini_batch_size % 2:
            raise ValueError("algorithm.name=dpo keeps each (chosen, rejected) pair in one micro-batch: "
                             "train.mini_batch_size and train.micro_batch_size must be even")

    def uses_reference(self, cfg: Config) -> bool:
        return True

    def pairs_section(self, cfg: Config) -> DPOConfig:
        return cfg.algorithm.dpo

    def consumers(self, cfg: Config) -> dict[str, list[str]]:
        return {"ref_infer": list(ROLLOUT), "actor_update": [*ROLLOUT, "response_mask", "ref_log_prob"]}

    def policy_loss(self, cfg: Config, logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        """Rows alternate chosen, rejected; the loss is a mean over the mini-batch's pairs, so each micro-batch
        contributes its sum divided by the pairs of the whole mini-batch."""
        from dockflow.algos.dpo import dpo_loss, sequence_log_probs

        mask, dpo = micro["response_mask"], cfg.algorithm.dpo
        seq, ref = sequence_log_probs(logp, mask), sequence_log_probs(micro["ref_log_prob"], mask)
        out = dpo_loss(seq[0::2], seq[1::2], ref[0::2], ref[1::2], dpo.beta, dpo.label_smoothing)
        loss = out.loss * (len(seq) // 2) / (cfg.train.mini_batch_size // 2)
        return loss, {
            "train/loss": float(out.loss.detach()), "train/dpo_reward_accuracy": float(out.reward_accuracy),
            "train/dpo_margin": float(out.margin), "train/dpo_chosen_reward": float(out.chosen_reward.mean()),
            "train/dpo_rejected_reward": float(out.rejected_reward.mean()),
        }

    def summary(self, scores: list[tuple[int, dict[str, float]]]) -> dict[str, Any]:
        if not scores:
            return {}
        return {"margin_before": scores[0][1][MARGIN] if scores[0][0] == 0 else None, "margin_after": scores[-1][1][MARGIN]}
