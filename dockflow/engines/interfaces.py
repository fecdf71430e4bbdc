"""The engine interfaces: one for generation, one for training. Stages and workers see only these.

A backend (transformers on CPU today; vLLM / FSDP2 / MindSpeed where present) implements them and is
chosen by ``dockflow.engines.create_*``. Tensors crossing these interfaces are plain torch tensors in a
TensorDict with the layout below, so no backend type leaks into the stages.

Rollout layout (B sequences, prompt width P, response width R = max_new_tokens):
    input_ids       [B, P+R] long   left-padded prompt, then the response, right-padded
    attention_mask  [B, P+R] long   1 on real prompt tokens and on response tokens up to and incl. EOS
    responses       [B, R]   long   the generated tokens (pad after EOS)
    response_mask   [B, R]   long   1 on generated tokens up to and including EOS
    prompt_length   [B]      long   real prompt tokens
    response_length [B]      long   real response tokens (incl. EOS)
    rollout_log_prob [B, R]  float  the generating engine's log-prob of each response token (logits divided by
                                    the sampling temperature, as ``dockflow.engines.logprobs``), 0 past the mask
    routed_experts [B, P+R, L, K] int16  mixture-of-experts policies only: for each position of ``input_ids``, at each
                                    of the L MoE layers (layer order), the K expert ids the generating engine's router
                                    chose (torch.topk order; replay uses the set); -1 = not recorded (padding, and the
                                    last sampled token, never fed back): the trainer routes those itself
                                    (``dockflow.engines.routing``)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict

from dockflow.config.engine import EngineConfig
from dockflow.config.sections import LoraConfig, RolloutConfig, TrainConfig
from dockflow.engines.routing import RoutingStats
from dockflow.engines.sync_check import SyncProbe


@dataclass(frozen=True)
class EngineInputs:
    """What building a policy's engines reads of a run's config: the ``engine``, ``train`` (optimizer, data
    parallelism, stage timeout) and ``rollout`` (temperature, generation batch) sections, the model's dtype
    (``model.dtype``) and the seed (``run.seed``), both for vLLM; ``model.lora`` (None: full fine-tuning)."""

    engine: EngineConfig
    train: TrainConfig
    rollout: RolloutConfig
    dtype: str
    seed: int
    lora: LoraConfig | None = None


@dataclass(frozen=True)
class SamplingParams:
    """How to sample responses."""

    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    n: int = 1  # responses per prompt, laid out contiguously (a GRPO group)


class GenerationEngine(ABC):
    """Turns prompts into rollouts in the layout above."""

    @abstractmethod
    def generate(
        self, prompts: list[str], params: SamplingParams, seed: int, prompt_width: int | None = None
    ) -> TensorDict:
        """Sample ``params.n`` responses per prompt; ``prompt_width`` pads prompts to a fixed width."""

    @abstractmethod
    def prompt_width(self, prompts: list[str]) -> int:
        """Token width that fits every prompt (chunks of one iteration are padded to it)."""

    @abstractmethod
    def decode(self, responses: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        """Response tokens to text, without padding and special tokens."""

    @abstractmethod
    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Take new policy weights (the reshard target)."""

    def sample(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, params: SamplingParams,
        seed: int, generated: torch.Tensor | None = None, row_caps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Continue left-padded token rows by up to ``max_new_tokens`` tokens: (tokens, log-probs), [B, T] each.
        ``generated`` [B] counts the response tokens each row already holds, ``row_caps`` [B] how many more each
        may take (<= ``max_new_tokens``; the caller masks past them, so a backend may ignore both, or stop each
        row at its cap). What partial rollouts need (``dockflow.rollout.partial``); a backend without it cannot
        resume."""
        raise NotImplementedError(f"{type(self).__name__} cannot continue partial rollouts")

    def turn_stream(self, tokenizer: Any, params: SamplingParams, seed: int) -> Any | None:
        """Tool-loop turns as requests of their own (``submit`` / ``step``: ``dockflow.agents.stream_loop``), or None
        when this engine samples turns a batch at a time (``dockflow.engines.turn_sampler.BatchSampler``)."""
        return None

    def samples_with(self, module: torch.nn.Module) -> bool:
        """Whether this engine samples with ``module``'s own tensors (HF generation colocated with its trainer):
        then a sync copies nothing, and the sync check has nothing to compare."""
        return False

    def probe_log_probs(self, tokens: torch.Tensor) -> torch.Tensor:
        """[K, L-1]: the engine's log-prob of each token of ``tokens`` [K, L] given the ones before it
        (temperature 1), for the weight-sync check (``dockflow.engines.sync_check``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot score a sync probe")

    def check_sync(self, probe: SyncProbe) -> float:
        """After :meth:`load_weights`: the probe's log-probs under this engine's weights equal the trainer's;
        returns the largest difference, raises :class:`WeightSyncError` past the probe's tolerance."""
        return probe.verify(self.probe_log_probs(probe.tokens), type(self).__name__)


LossFn = Callable[[torch.Tensor, TensorDict, float], tuple[torch.Tensor, dict[str, float]]]
"""(per-token outputs [b, R] with grad (log-probs, or values), micro-batch, token count of the mini-batch)
-> (loss, metrics)."""


class TrainingEngine(ABC):
    """Holds the trainable model and its optimizer."""

    @abstractmethod
    def infer(self, batch: TensorDict) -> torch.Tensor:
        """The model's per-response-token output under the current weights, no grad: [B, R].

        A policy gives the log-probs of ``batch['responses']``; a critic gives values."""

    @abstractmethod
    def train_mini_batch(self, batch: TensorDict, loss_fn: LossFn, micro_batch_size: int) -> dict[str, float]:
        """One optimizer step over ``batch`` with gradient accumulation; returns averaged metrics."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Model and optimizer state for a checkpoint."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output exactly."""

    def save_state(self, store: Any, step: int, part: str) -> Any:
        """This engine's share of checkpoint ``step`` (collective over the engine's ranks): what its worker keeps
        in part ``part``. An engine that writes its own parts of ``step`` (named ``part.<...>``) returns what finds
        them again; the driver's commit takes them in."""
        return self.state_dict()

    def load_state(self, store: Any, step: int, part: str, saved: Any) -> None:
        """Restore what :meth:`save_state` returned (``saved``) and wrote into checkpoint ``step``."""
        self.load_state_dict(saved)

    def infer_reference(self, batch: TensorDict) -> torch.Tensor:
        """:meth:`infer` under the reference policy when it is this engine's base model (LoRA: the adapter off)."""
        raise NotImplementedError(f"{type(self).__name__} holds no reference policy")

    @abstractmethod
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Current weights, for resharding into a generation engine."""

    @abstractmethod
    def policy_module(self) -> torch.nn.Module:
        """The whole (unsharded) model as one Hugging Face module, which the actor's evaluation, weight-sync probe
        and saved models read (a critic's engine: its value model); a sharded backend gives its generation copy."""

    def generation_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights generation runs with after an update: the reshard step. On one process they are the
        training weights themselves; a sharded backend gathers them into full copies (collective)."""
        return self.named_weights()

    def memory_metrics(self) -> dict[str, float]:
        """Memory ledger metrics since the last call (``memory/...`` bytes; none where nothing is measured)."""
        return {}

    def routing_stats(self) -> RoutingStats:
        """An MoE policy's routing mismatch with the batches' ``routed_experts`` counted since the last call
        (``moe/routing_mismatch``); nothing counted for a dense model or batches without them."""
        return RoutingStats()
