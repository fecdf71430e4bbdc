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

from dockflow.engines.interfaces import LossFn, TrainingEngine
from dockflow.engines.logprobs import (
    ResponseFn,
    TokenOutputs,
    batched_response_outputs,
    forward_load,
    packs,
    response_log_probs,
)
from dockflow.engines.lora import adapter_off, is_lora, load_adapters, trainable_names, trainable_state
from dockflow.engines.micro_batches import micro_batch_bounds
from dockflow.engines.routing import RouterReplay, Routing, RoutingStats, batch_routing, routed


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
        max_tokens_per_micro_batch: int | None = None,
        gradient_checkpointing: bool = False,
        router_replay: bool = False,
    ):
        """``router_replay``: an MoE policy's forward uses the batches' recorded experts (``routed_experts``,
        ``engines/routing.py``); either way its routers count how often their own top-k differs from them."""
        self.device = torch.device(device)
        if gradient_checkpointing:  # before sharding: FSDP2 wraps the checkpointed layers
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = self._wrap(model.to(device))
        self.grad_clip = grad_clip
        self.infer_batch_size = infer_batch_size
        # A policy's head gives log-probs at the sampling temperature (they must match the behaviour policy);
        # a critic passes response_values instead.
        self.response_fn = response_fn or partial(response_log_probs, temperature=temperature)
        # only what trains has optimizer state (LoRA: the adapters; the frozen base never gets a grad)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay)
        self.lora = is_lora(model)  # then checkpoints hold the adapters only
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch  # None: micro-batches of micro_batch_size rows
        self.router = RouterReplay.attach(self.model, router_replay)  # None: a dense model

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

    def _micro_batches(self, batch: TensorDict, micro_batch_size: int) -> list[tuple[int, int]]:
        """Row ranges of the micro-batches (``engines/micro_batches.py``); a DP backend makes every rank's count
        equal, with empty ranges ``(i, i)`` where a rank has fewer."""
        lengths = batch["attention_mask"].sum(-1).tolist()
        return micro_batch_bounds(lengths, micro_batch_size, self.max_tokens_per_micro_batch)

    def _rank_loads(self, load: torch.Tensor) -> torch.Tensor:
        """Every DP rank's ``load`` (a 1-D tensor), stacked [ranks, ...]; one process: its own."""
        return load.unsqueeze(0)

    def _agree(self, pack: bool) -> bool:
        """The layout every DP rank uses for this forward (they must call the model alike); one process: its own."""
        return pack

    def _packed_response(self, model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, width: int,
                         routing: Routing | None = None) -> tuple[TokenOutputs, bool]:
        """``response_fn`` packed or through the shared-prompt pass, whichever costs less (``logprobs.packs``; the
        DP ranks agree), and whether it packed; ``routing``: the rows' recorded experts (both layouts replay)."""
        pack = self._agree(packs(model, ids, mask, width))
        extra = {} if routing is None else {"routing": routing}
        return self.response_fn(model, ids, mask, width, pack=pack, **extra), pack

    def _response(self, model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, width: int,
                  routing: Routing | None = None) -> TokenOutputs:
        return self._packed_response(model, ids, mask, width, routing)[0]

    def _forward(self, batch: TensorDict) -> tuple[TokenOutputs, bool]:
        """The micro-batch's outputs, and whether it went through packed."""
        ids, mask = batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
        return self._packed_response(self.model, ids, mask, batch["responses"].shape[1],
                                     batch_routing(self.router, batch))

    def infer(self, batch: TensorDict) -> torch.Tensor:
        return batched_response_outputs(self.model, batch, self.infer_batch_size, self._response, self.router)

    def routing_stats(self) -> RoutingStats:
        return self.router.take_stats() if self.router is not None else RoutingStats()

    def infer_reference(self, batch: TensorDict) -> torch.Tensor:
        """LoRA: the base model's outputs (the adapter off), the reference policy of a LoRA run."""
        if not self.lora:
            raise NotImplementedError("only a LoRA policy holds its reference (the base model): model.lora is null")
        with adapter_off(self.model):
            return self.infer(batch)

    def train_mini_batch(self, batch: TensorDict, loss_fn: LossFn, micro_batch_size: int) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        tokens = self._total_tokens(batch)
        out: dict[str, float] = {}
        positions = real = 0.0  # token positions the forward passes compute, and the real tokens among them
        for lo, hi in self._micro_batches(batch, micro_batch_size):
            if lo == hi:  # another DP rank has more micro-batches: a forward and backward that add nothing
                micro = batch[:1].to(self.device)
                counted = self.routing_stats()  # a row that adds nothing counts no routing mismatch either
                with routed(self.router):
                    loss, _ = loss_fn(self._forward(micro)[0].values, micro, tokens)
                    self._backward(loss * 0.0)
                if self.router is not None:
                    self.router.stats = counted
                continue
            micro = batch[lo:hi].to(self.device)  # the loss reads its columns next to logp
            with routed(self.router):  # the fed routing stays for the backward's recomputed layers
                outputs, pack = self._forward(micro)
                loss, metrics = loss_fn(outputs.values, micro, tokens)
                self._backward(loss)
            micro_positions, micro_real = forward_load(micro, pack)
            positions, real = positions + micro_positions, real + micro_real
            mask = micro["response_mask"]
            share = float(mask.sum()) / tokens  # metrics are token means of the micro-batch
            if outputs.entropy is not None:  # the policy's entropy (a critic has none)
                metrics = {**metrics, "train/entropy": float((outputs.entropy * mask).sum() / mask.sum().clamp(min=1))}
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

    def _backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``; checkpointed layers that run again in it count no routing mismatch twice."""
        if self.router is not None:
            self.router.counting = False
        try:
            loss.backward()
        finally:
            if self.router is not None:
                self.router.counting = True

    def state_dict(self) -> dict[str, Any]:
        """Model (LoRA: the adapters only; the base is the run's initial model) and optimizer state."""
        model = self.model.state_dict()
        if self.lora:
            model = trainable_state(model, trainable_names(self.model))
        return {"model": model, "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.lora:
            load_adapters(self.model, state["model"])
        else:
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
