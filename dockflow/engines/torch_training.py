"""Training on one process with plain torch: AdamW, gradient accumulation, global-norm clipping.

This is the DP=1 backend of :class:`TrainingEngine`. Micro-batches of a mini-batch each contribute
``loss * 1`` with the loss already normalised by the mini-batch token count (see ``LossFn``), so the
summed gradient equals that of one token-level mean over the whole mini-batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

from dockflow.engines.base import LossFn, TrainingEngine
from dockflow.engines.logprobs import ResponseFn, batched_response_outputs, forward_load, response_log_probs


class TorchTrainingEngine(TrainingEngine):
    """A model and its AdamW optimizer on one device."""

    def __init__(
        self,
        model: nn.Module,
        *,
        lr: float,
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
        infer_batch_size: int = 64,
        temperature: float = 1.0,
        device: str | torch.device = "cpu",
        response_fn: ResponseFn | None = None,
    ):
        self.device = torch.device(device)
        self.model = self._wrap(model.to(device))
        self.grad_clip = grad_clip
        self.infer_batch_size = infer_batch_size
        # A policy's head gives log-probs at the sampling temperature (they must match the behaviour policy);
        # a critic passes response_values instead.
        self.response_fn = response_fn or partial(response_log_probs, temperature=temperature)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)

    def policy_module(self) -> nn.Module:
        return self.model

    def _wrap(self, model: nn.Module) -> nn.Module:
        """The module to train (a data-parallel backend shards it here); one process: the module itself."""
        return model

    def _total_tokens(self, batch: TensorDict) -> float:
        """Response tokens of the whole mini-batch (the loss's denominator); one process: this batch's."""
        return float(batch["response_mask"].sum().clamp(min=1))

    def _clip_grads(self) -> torch.Tensor:
        """Clip to the global grad norm and return it (before clipping)."""
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)

    def _reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Token-weighted metrics of the whole mini-batch; one process: already complete."""
        return metrics

    def _rank_loads(self, load: torch.Tensor) -> torch.Tensor:
        """Every DP rank's ``load`` (a 1-D tensor), stacked [ranks, ...]; one process: its own."""
        return load.unsqueeze(0)

    def _forward(self, batch: TensorDict) -> torch.Tensor:
        ids, mask = batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
        return self.response_fn(self.model, ids, mask, batch["responses"].shape[1])

    def infer(self, batch: TensorDict) -> torch.Tensor:
        return batched_response_outputs(self.model, batch, self.infer_batch_size, self.response_fn)

    def train_mini_batch(self, batch: TensorDict, loss_fn: LossFn, micro_batch_size: int) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        tokens = self._total_tokens(batch)
        out: dict[str, float] = {}
        positions = real = 0.0  # token positions the forward passes compute, and the real tokens among them
        for i in range(0, batch.batch_size[0], micro_batch_size):
            micro = batch[i : i + micro_batch_size].to(self.device)  # the loss reads its columns next to logp
            micro_positions, micro_real = forward_load(micro)
            positions, real = positions + micro_positions, real + micro_real
            logp = self._forward(micro)
            loss, metrics = loss_fn(logp, micro, tokens)
            loss.backward()
            share = float(micro["response_mask"].sum()) / tokens  # metrics are token means of the micro-batch
            for k, v in metrics.items():
                out[k] = out.get(k, 0.0) + v * share
        out = self._reduce_metrics(out)
        out.update(load_metrics(self._rank_loads(torch.tensor([positions, real]))))
        grad_norm = self._clip_grads()
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        out["grad_norm"] = float(grad_norm)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, p in self.model.named_parameters():
            yield name, p.detach()


def load_metrics(loads: torch.Tensor) -> dict[str, float]:
    """From [ranks, (computed positions, real tokens)]: the padding share of the computed positions, and how
    much the busiest rank computed against the mean (1.0 = balanced; the step waits for the busiest)."""
    computed, real = loads[:, 0], loads[:, 1]
    total = float(computed.sum().clamp(min=1))
    return {
        "train/padding_fraction": 1.0 - float(real.sum()) / total,
        "train/dp_load_imbalance": float(computed.max()) / (total / len(computed)),
    }
