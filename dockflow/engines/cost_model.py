"""Cost-model engines: generation and training whose durations are explicit, for measuring schedules.

They implement the same interfaces as the real backends and plug in the same way (``engine.backend:
cost_model``), so the workers, the dock and the schedulers run unchanged while the compute is replaced by
time that a formula gives:

- generation of a chunk of sequences takes ``prefill_s_per_token x prompt tokens / cpus`` plus
  ``decode_s_per_step x`` its longest response (decoding is latency-bound: a chunk waits for its longest
  sequence, the long tail); response lengths are lognormal(``length_mu``, ``length_sigma``), clipped to
  ``[1, max_new_tokens]``, drawn from the generation seed;
- inference and training take ``infer_s_per_token`` / ``train_s_per_token`` x tokens / cpus.

Responses are random tokens ending in EOS, in the real rollout layout, so rewards and losses run on them
(the policy does not learn: accuracy is meaningless here). The time is spent in ``time.sleep``: the worker
process is idle meanwhile, which is what lets several cost-model workers run side by side on 2 cores.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import torch
from tensordict import TensorDict

from dockflow.config import CostModelConfig
from dockflow.engines.interfaces import GenerationEngine, LossFn, SamplingParams, TrainingEngine
from dockflow.engines.token_layout import decode_responses, left_pad_prompts, rollout_batch


def _cpus(cpus: float, per_token: dict[str, float]) -> float:
    """The worker's CPUs, which per-token times are divided by; 0 CPUs would make them endless."""
    if cpus <= 0 and any(per_token.values()):
        keys = ", ".join(f"engine.cost_model.{k}" for k, v in per_token.items() if v)
        raise ValueError(f"the cost model divides {keys} by the worker's CPUs, and this worker has {cpus}: give it "
                         "CPUs (placement.generator_cpus / ray.actor_cpus) or set those times to 0")
    return cpus


class CostModelGeneration(GenerationEngine):
    """Rollouts of modelled lengths after a modelled time."""

    def __init__(self, tokenizer, cost: CostModelConfig, batch_size: int, cpus: float) -> None:
        self.tokenizer, self.cost, self.batch_size = tokenizer, cost, batch_size
        self.cpus = _cpus(cpus, {"prefill_s_per_token": cost.prefill_s_per_token}) or 1.0

    def prompt_width(self, prompts: list[str]) -> int:
        return max(len(self.tokenizer(p)["input_ids"]) for p in prompts)

    def response_lengths(self, count: int, max_new_tokens: int, seed: int) -> torch.Tensor:
        """Lognormal response lengths in ``[1, max_new_tokens]`` (EOS included), reproducible from ``seed``."""
        gen = torch.Generator().manual_seed(seed)
        normal = torch.randn(count, generator=gen, dtype=torch.float64)
        lengths = torch.exp(self.cost.length_mu + self.cost.length_sigma * normal).round().long()
        return lengths.clamp(1, max_new_tokens)

    def generate(
        self, prompts: list[str], params: SamplingParams, seed: int, prompt_width: int | None = None
    ) -> TensorDict:
        prompt_ids, prompt_mask = left_pad_prompts(self.tokenizer, prompts, prompt_width)
        prompt_ids = prompt_ids.repeat_interleave(params.n, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(params.n, dim=0)
        count, width = prompt_ids.shape[0], params.max_new_tokens
        lengths = self.response_lengths(count, width, seed)
        gen = torch.Generator().manual_seed(seed + 1)
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        responses = torch.randint(len(self.tokenizer), (count, width), generator=gen)
        responses[responses == eos] = pad  # the only EOS is the one placed below
        positions = torch.arange(width).unsqueeze(0)
        response_mask = (positions < lengths.unsqueeze(1)).long()
        responses[torch.arange(count), lengths - 1] = eos
        responses = torch.where(response_mask.bool(), responses, torch.full_like(responses, pad))
        seconds = self.cost.prefill_s_per_token * float(prompt_mask.sum()) / self.cpus
        for start in range(0, count, self.batch_size):
            seconds += self.cost.decode_s_per_step * int(lengths[start : start + self.batch_size].max())
        time.sleep(seconds)
        out = rollout_batch(prompt_ids, prompt_mask, responses, response_mask)
        out["rollout_log_prob"] = torch.zeros(responses.shape, dtype=torch.float32)  # no policy: modelled as 0
        return out

    def remaining_lengths(self, generated: torch.Tensor, max_new_tokens: int, seed: int) -> torch.Tensor:
        """Tokens each row still produces (EOS included): its total length drawn from the lognormal conditioned on
        exceeding the ``generated`` tokens it already has (inverse CDF on the upper tail), reproducible from ``seed``."""
        gen = torch.Generator().manual_seed(seed)
        mu, sigma = self.cost.length_mu, self.cost.length_sigma
        floor = torch.special.ndtr((torch.log(generated.double() + 0.5) - mu) / sigma)  # P(length <= generated)
        u = floor + (1 - floor) * torch.rand(len(generated), generator=gen, dtype=torch.float64)
        total = torch.exp(mu + sigma * torch.special.ndtri(u.clamp(max=1 - 1e-12))).round().long()
        return torch.maximum(total.clamp(max=max_new_tokens), generated + 1) - generated

    def sample(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, params: SamplingParams,
        seed: int, generated: torch.Tensor | None = None, row_caps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Continue rows (partial rollouts): each ends at its modelled length or after ``max_new_tokens``, and the
        call takes the prefill of every real token (the resumed prefix is recomputed) plus the decode steps."""
        count = input_ids.shape[0]
        done = torch.zeros(count, dtype=torch.long) if generated is None else generated.long()
        remaining = self.remaining_lengths(done, params.max_new_tokens, seed)
        gen = torch.Generator().manual_seed(seed + 1)
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        tokens = torch.randint(len(self.tokenizer), (count, max_new_tokens), generator=gen)
        tokens[tokens == eos] = pad
        steps = remaining.clamp(max=max_new_tokens)
        ends = remaining <= max_new_tokens
        tokens[ends.nonzero().flatten(), remaining[ends] - 1] = eos
        tokens = torch.where(torch.arange(max_new_tokens).unsqueeze(0) < steps.unsqueeze(1), tokens, pad)
        seconds = self.cost.prefill_s_per_token * float(attention_mask.sum()) / self.cpus
        for start in range(0, count, self.batch_size):
            seconds += self.cost.decode_s_per_step * int(steps[start : start + self.batch_size].max())
        time.sleep(seconds)
        return tokens, torch.zeros(tokens.shape, dtype=torch.float32)

    def decode(self, responses: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        return decode_responses(self.tokenizer, responses, response_mask)

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Nothing to hold: the modelled policy has no weights."""


class CostModelTraining(TrainingEngine):
    """Inference and optimizer steps that take modelled time; the loss still runs on zero log-probs."""

    def __init__(self, cost: CostModelConfig, cpus: float, model: torch.nn.Module) -> None:
        per_token = {"infer_s_per_token": cost.infer_s_per_token, "train_s_per_token": cost.train_s_per_token}
        self.cost, self.cpus = cost, _cpus(cpus, per_token) or 1.0
        self.model = model  # never trained: evaluation and the saved final model show the initial policy

    def _tokens(self, batch: TensorDict) -> float:
        return float(batch["attention_mask"].sum())

    def infer(self, batch: TensorDict) -> torch.Tensor:
        time.sleep(self.cost.infer_s_per_token * self._tokens(batch) / self.cpus)
        return torch.zeros(batch["responses"].shape, dtype=torch.float32)

    def train_mini_batch(self, batch: TensorDict, loss_fn: LossFn, micro_batch_size: int) -> dict[str, float]:
        time.sleep(self.cost.train_s_per_token * self._tokens(batch) / self.cpus)
        tokens = float(batch["response_mask"].sum().clamp(min=1))
        logp = torch.zeros(batch["responses"].shape, dtype=torch.float32, requires_grad=True)
        loss, metrics = loss_fn(logp, batch, tokens)
        loss.backward()
        return {**metrics, "grad_norm": float(logp.grad.norm()) if logp.grad is not None else math.nan}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(())

    def policy_module(self) -> torch.nn.Module:
        return self.model
