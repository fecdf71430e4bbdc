"""DPO (Rafailov et al., 2023, "Direct Preference Optimization: Your Language Model is Secretly a Reward
Model"): a classification loss on preference pairs, no reward model and no sampling.

With sequence log-probs ``pi_c, pi_r`` (policy, chosen / rejected) and ``ref_c, ref_r`` (reference),
``h = (pi_c - pi_r) - (ref_c - ref_r)`` and

    loss = -(1 - eps) * log sigmoid(beta * h) - eps * log sigmoid(-beta * h)

averaged over pairs; ``eps = label_smoothing`` is conservative DPO (cDPO, Mitchell 2023: the labels are
flipped with probability eps), ``eps = 0`` plain DPO. The implicit rewards are ``beta * (pi - ref)``.

One iteration: offline preference pairs against the frozen reference; no rollouts, no reward.

1. generate: the pair source worker puts the iteration's (chosen, rejected) pairs into the dock window, chosen at
   even and rejected at odd indices (``workers/pairs.py``); pairs come from ``pairs_path`` or are built from the
   task (the right answer chosen, a near miss rejected; ``data/preferences.py``).
2. infer: the reference worker's log-probs of every row (``consumers``).
3. update: ``dpo_loss`` on sequence log-probs, pair by pair (``policy_loss``); rows stay in pairs and in order
   (``paired_rows``).
4. reshard; evaluations add the policy's margin, chosen minus rejected, on held-out pairs (``evaluate``:
   ``preference_margin``), and the summary the margins before and after (``summary``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.base import ROLLOUT, Algorithm
from dockflow.config.algorithm import AlgorithmSection, PreferenceSection

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


def sequence_log_probs(token_logp: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B, R]`` token log-probs -> ``[B]`` sequence log-probs: the sum over real tokens (0 for none)."""
    from dockflow.algos.utils import masked_sum

    return masked_sum(token_logp, response_mask.to(token_logp.dtype), dim=-1)


@dataclass
class DPOOutput:
    """``loss`` carries the gradient; the rest are detached batch means for logging."""

    loss: torch.Tensor
    chosen_reward: torch.Tensor  # mean of beta * (pi_c - ref_c)
    rejected_reward: torch.Tensor  # mean of beta * (pi_r - ref_r)
    reward_accuracy: torch.Tensor  # share of pairs with chosen_reward > rejected_reward
    margin: torch.Tensor  # mean of pi_c - pi_r (policy log-probs only)


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> DPOOutput:
    """DPO loss on ``[B]`` sequence log-probs of B preference pairs: the mean over the pairs."""
    import torch
    import torch.nn.functional as F  # noqa: N812 - torch's own spelling

    if not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5], got {label_smoothing}")
    logits = beta * ((policy_chosen - policy_rejected) - (ref_chosen - ref_rejected))
    per_pair = -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    loss = per_pair.sum() / max(per_pair.numel(), 1)
    with torch.no_grad():
        chosen = beta * (policy_chosen - ref_chosen)
        rejected = beta * (policy_rejected - ref_rejected)
        zero = per_pair.new_zeros(())
        if per_pair.numel() == 0:
            return DPOOutput(loss, zero, zero, zero, zero)
        return DPOOutput(
            loss,
            chosen.mean(),
            rejected.mean(),
            (chosen > rejected).to(per_pair.dtype).mean(),
            (policy_chosen - policy_rejected).mean(),
        )


def preference_margin(engine: Any, pairs: TensorDict) -> float:
    """Mean log-prob margin, chosen minus rejected, of the policy in ``engine`` (a ``TrainingEngine``) on ``pairs``
    (rows chosen, rejected, ...)."""
    import torch

    with torch.no_grad():
        seq = sequence_log_probs(engine.infer(pairs), pairs["response_mask"])
        return float((seq[0::2] - seq[1::2]).mean())


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
        """The reference's log-probs of every row, then the actor's update on them."""
        return {"ref_infer": list(ROLLOUT), "actor_update": [*ROLLOUT, "response_mask", "ref_log_prob"]}

    def policy_loss(self, cfg: Config, logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        """Rows alternate chosen, rejected; the loss is a mean over the mini-batch's pairs, so each micro-batch
        contributes its sum divided by the pairs of the whole mini-batch."""
        mask, dpo = micro["response_mask"], cfg.algorithm.dpo
        seq, ref = sequence_log_probs(logp, mask), sequence_log_probs(micro["ref_log_prob"], mask)
        out = dpo_loss(seq[0::2], seq[1::2], ref[0::2], ref[1::2], dpo.beta, dpo.label_smoothing)
        loss = out.loss * (len(seq) // 2) / (cfg.train.mini_batch_size // 2)
        return loss, {
            "train/loss": float(out.loss.detach()), "train/dpo_reward_accuracy": float(out.reward_accuracy),
            "train/dpo_margin": float(out.margin), "train/dpo_chosen_reward": float(out.chosen_reward.mean()),
            "train/dpo_rejected_reward": float(out.rejected_reward.mean()),
        }

    def evaluate(self, engine: Any, cfg: Config, pairs: Any) -> dict[str, float]:
        """The policy's margin on the pair source's held-out pairs (``PairSource.eval_pairs``)."""
        return {} if pairs is None else {MARGIN: preference_margin(engine, pairs)}

    def summary(self, scores: list[tuple[int, dict[str, float]]]) -> dict[str, Any]:
        if not scores:
            return {}
        return {"margin_before": scores[0][1][MARGIN] if scores[0][0] == 0 else None, "margin_after": scores[-1][1][MARGIN]}
