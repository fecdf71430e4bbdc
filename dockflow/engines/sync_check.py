"""Did a weight sync take? After a sync the generation engine scores a few fixed token sequences and compares
their log-probs with the trainer's on the same sequences: a sync that silently kept part of the old policy
(a tensor that was not loaded, a kernel that was not rebuilt) shows as a difference far above numerical noise,
and the run stops with one line naming the sync, instead of training on, off-policy, with nothing said.

The probe is random token ids (seeded, the same every sync): every weight of the model takes part in their
log-probs, and no tokenizer or prompt is needed. Log-probs are at temperature 1 (vLLM's prompt log-probs skip
the sampler, so they are the model's own distribution).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

SYNC_CHECK = "reshard/sync_check_max_diff"  # the metric: largest probe log-prob difference of a checked sync


class WeightSyncError(RuntimeError):
    """A weight sync left the generation engine with weights other than the trainer's."""


@dataclass(frozen=True)
class SyncProbe:
    """Token sequences [K, L], the trainer's log-probs of tokens 1..L-1 given the ones before [K, L-1], the
    tolerance on their largest absolute difference, and which sync (1, 2, ...) this checks."""

    tokens: torch.Tensor
    reference: torch.Tensor
    tolerance: float
    sync: int

    def verify(self, got: torch.Tensor, engine: str) -> float:
        """The largest absolute difference of ``got`` from the reference; :class:`WeightSyncError` past the
        tolerance."""
        if got.shape != self.reference.shape:
            raise WeightSyncError(f"weight sync {self.sync}: {engine} scored the probe as {tuple(got.shape)}, "
                                  f"the trainer as {tuple(self.reference.shape)}")
        diff = float((got.float() - self.reference.float()).abs().max())
        if not diff <= self.tolerance:  # NaN fails too
            raise WeightSyncError(
                f"weight sync {self.sync} did not take: {engine}'s log-probs of {len(self.tokens)} probe sequences "
                f"differ from the trainer's by up to {diff:.3g} (tolerance {self.tolerance:g}); generation would "
                "sample from other weights than the ones being trained (engine.sync_check in docs/engines.md)"
            )
        return diff


def probe_tokens(vocab_size: int, sequences: int, length: int, seed: int) -> torch.Tensor:
    """[sequences, length] token ids drawn uniformly from the vocabulary, the same for the same seed."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (sequences, length), generator=gen)


@torch.no_grad()
def reference_log_probs(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """[K, L-1]: ``model``'s log-prob of each token given the ones before it (temperature 1)."""
    device = next(model.parameters()).device
    ids = tokens.to(device)
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
    logp = F.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return logp.cpu()


class SyncChecker:
    """Counts a worker's syncs and builds the probe of every ``every``-th one (``engine.sync_check``)."""

    def __init__(self, every: int, sequences: int, length: int, tolerance: float, seed: int) -> None:
        self.every, self.sequences, self.length = every, sequences, length
        self.tolerance, self.seed = tolerance, seed
        self.syncs = 0

    def next_probe(self, model: nn.Module, vocab_size: int) -> SyncProbe | None:
        """Count a sync of ``model``'s current weights; its probe when this one is checked, else None."""
        self.syncs += 1
        if self.every <= 0 or self.syncs % self.every:
            return None
        tokens = probe_tokens(vocab_size, self.sequences, self.length, self.seed)
        return SyncProbe(tokens, reference_log_probs(model, tokens), self.tolerance, self.syncs)


class LogProbDrift:
    """How far the generating engine's log-probs of its sampled tokens are from the trainer's log-probs of the same
    tokens under the same weights: ~0 for a correct engine, a jump after a sync is the first sign of a stale
    policy. Accumulated over an iteration's batches; the metric names are in docs/metrics.md (slime's
    ``train_rollout_logprob_abs_diff``, NeMo-RL's ``token_mult_prob_error``)."""

    def __init__(self) -> None:
        self.abs_sum = 0.0
        self.mult_sum = 0.0
        self.max = 0.0
        self.tokens = 0

    def add(self, rollout: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor) -> None:
        """One batch: [B, R] log-probs of both engines and the response mask."""
        keep = mask.bool()
        if not bool(keep.any()):
            return
        diff = (rollout.float() - trainer.float()).abs()[keep]
        self.abs_sum += float(diff.sum())
        self.mult_sum += float(diff.exp().sum())
        self.max = max(self.max, float(diff.max()))
        self.tokens += int(keep.sum())

    @classmethod
    def merged(cls, drifts: list[LogProbDrift]) -> LogProbDrift:
        """One drift of several ranks' (each compared its own share of the samples)."""
        out = cls()
        for drift in drifts:
            out.abs_sum += drift.abs_sum
            out.mult_sum += drift.mult_sum
            out.max = max(out.max, drift.max)
            out.tokens += drift.tokens
        return out

    def metrics(self) -> dict[str, float]:
        """Mean and max absolute difference, and the mean of exp(|difference|) (1 = identical); none when no
        token was compared."""
        if not self.tokens:
            return {}
        return {
            "rollout/logprob_abs_diff_mean": self.abs_sum / self.tokens,
            "rollout/logprob_abs_diff_max": self.max,
            "rollout/token_mult_prob_error": self.mult_sum / self.tokens,
        }
