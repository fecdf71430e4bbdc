"""Routing replay on the megatron engine: each MoE router's top-k, its own or the rollout's.

``routed_experts [B, P+R, L, K]`` (int16, ``engines/interfaces.py``) holds, for every token position of
``input_ids`` and each of the L MoE layers, the K experts the generating engine's router chose; -1 where nothing was
recorded (padding, the last sampled token). megatron-core 0.16.1's router asks its ``router_replay`` object for the
top-k (``moe_utils.topk_routing_with_score_function``: ``get_replay_topk(scores, topk, num_groups, group_topk,
default_compute_topk)``; ``RouterReplay`` in ``moe/router_replay.py``, built when ``moe_enable_routing_replay``).
``LayerRouting`` stands in for it on every MoE layer of the engine's model: it computes the router's own top-k (kept
for the mismatch metric and the routing actually used) and, with a target set, returns the target's experts instead,
the gate weights gathered from the router's own scores at them (as ``RouterReplay``'s REPLAY_FORWARD does); a row
with a -1 keeps the router's own top-k. The target stays set until the next micro-batch, so activation recompute in
the backward pass (which runs right after its micro-batch's forward at PP = 1) routes the same way; megatron's
REPLAY_BACKWARD queue is not needed.

The load-balancing loss (megatron's ``aux_loss``, weight ``aux_coeff``): with ``calculate_per_token_loss`` megatron
adds each micro-batch's loss times its token count, expecting its ``finalize_model_grads`` to divide every gradient by
the global token count; the engine's recipes normalise the policy loss themselves and sum the DP ranks' grads, so
``micro`` sets the coefficient megatron reads to ``aux_coeff / (seq * rows * dp)`` (``start(rows * dp)``): the
step adds ``aux_coeff`` times the loss averaged over the micro-batches, weighted by their rows, and over the DP ranks.

Token order: the engine trims the batch's all-padding columns (``logprobs.trim_columns``) and megatron's router sees
a micro-batch's tokens as [s, b] flattened sequence-major, so a micro-batch's target for layer l is
``routed[rows, first:end, l].transpose(0, 1).reshape(-1, K)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dockflow.engines.logprobs import trim_columns

ROUTED_EXPERTS = "routed_experts"


class LayerRouting:
    """One MoE layer's ``router_replay``: the router's own top-k, or the target's experts where the target has them."""

    def __init__(self) -> None:
        self.target: torch.Tensor | None = None  # [tokens, K] of the micro-batch in flight, or None
        self.own: torch.Tensor | None = None  # the router's own top-k of the last forward
        self.used: torch.Tensor | None = None  # the experts the last forward routed to

    def get_replay_topk(self, scores: torch.Tensor, topk: int, num_groups: int | None = None,
                        group_topk: int | None = None,
                        default_compute_topk: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        assert default_compute_topk is not None  # megatron always passes its top-k
        probs, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        self.own = own.detach()
        if self.target is None:
            self.used = self.own
            return probs, own
        target = self.target.to(device=scores.device, dtype=torch.long)
        if target.shape != own.shape:
            raise ValueError(f"routed_experts gives {tuple(target.shape)} (tokens, experts per token) to a router "
                             f"that routes {tuple(own.shape)}; the column does not match the batch")
        chosen = torch.where((target < 0).any(-1, keepdim=True), own, target)
        self.used = chosen
        return scores.gather(1, chosen), chosen


def routers(model: Any) -> list[Any]:
    """The model's MoE routers (megatron's ``TopKRouter``), in layer order."""
    from megatron.core.transformer.moe.router import TopKRouter

    return [m for m in model.modules() if isinstance(m, TopKRouter)]


class ModelRouting:
    """A ``LayerRouting`` on every MoE router of ``model``; ``replay``: follow the batch's ``routed_experts``."""

    def __init__(self, model: Any, num_experts: int, topk: int, replay: bool, aux_coeff: float = 0.0) -> None:
        from megatron.core.transformer.moe.router_replay import RouterReplay

        self.replay, self.num_experts, self.topk, self.aux_coeff = replay, num_experts, topk, aux_coeff
        self.config = model.config
        self.aux_rows: float | None = None
        self.layers: list[LayerRouting] = []
        self._passes: list[BatchRouting] = []
        self._counts = torch.zeros(2, dtype=torch.float64)  # mismatch counts of this rank since ``take_counts``
        for router in routers(model):
            if router.router_replay is not None:  # megatron's own (moe_enable_routing_replay): ours replaces it
                RouterReplay.global_router_replay_instances.remove(router.router_replay)
            router.router_replay = LayerRouting()
            self.layers.append(router.router_replay)

    def start(self, aux_rows: float | None = None) -> None:
        """A new engine call (its passes make one batch, in order); an update's rows over every DP rank."""
        self._passes = []
        self.aux_rows = aux_rows

    def batch(self, routed: torch.Tensor | None, attention_mask: torch.Tensor, response_width: int) -> BatchRouting:
        """The routing of one pass over ``attention_mask``'s rows (``routed``: their ``routed_experts``, or None)."""
        if routed is not None:
            self._check(routed, attention_mask)
        self._passes.append(BatchRouting(self, routed, attention_mask, response_width))
        return self._passes[-1]

    def finish(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The call's (own top-k, experts used) [B, P+R, L, K] over its passes, and the mismatch counts
        (``mismatch_counts``) against the recorded routing, None without one."""
        done = [p.finish() for p in self._passes]
        counts = [mismatch_counts(own, p.routed, p.mask) for p, (own, _) in zip(self._passes, done, strict=True)
                  if p.routed is not None]
        self._passes = []
        total = torch.stack(counts).sum(0) if counts else None
        if total is not None:
            self._counts += total
        return torch.cat([own for own, _ in done]), torch.cat([used for _, used in done]), total

    def take_counts(self) -> tuple[int, int]:
        """(mismatched, recorded) entries of this rank's calls since the last take."""
        counts, self._counts = self._counts, torch.zeros(2, dtype=torch.float64)
        return int(counts[0]), int(counts[1])

    def _check(self, routed: torch.Tensor, attention_mask: torch.Tensor) -> None:
        expected = (*attention_mask.shape, len(self.layers), self.topk)
        if tuple(routed.shape) != expected:
            raise ValueError(f"{ROUTED_EXPERTS} has shape {tuple(routed.shape)}; this model needs {expected} "
                             "(batch, tokens, MoE layers, experts per token)")
        if routed.numel() and int(routed.max()) >= self.num_experts:
            raise ValueError(f"{ROUTED_EXPERTS} names expert {int(routed.max())}; the model has {self.num_experts}")


class BatchRouting:
    """One pass's micro-batches: ``micro(rows)`` before each forward sets the layers' targets and keeps the routing
    of the previous one; ``finish()`` gives the router's own top-k and the routing used, in the rollout layout."""

    def __init__(self, model: ModelRouting, routed: torch.Tensor | None, mask: torch.Tensor, width: int) -> None:
        self.model, self.routed, self.mask = model, routed, mask
        self.first, keep_r = trim_columns(mask, width)
        self.end = mask.shape[1] - width + keep_r
        layers, k = len(model.layers), model.topk
        self.own = torch.full((*mask.shape, layers, k), -1, dtype=torch.int16)
        self.used = self.own.clone()
        self._rows: slice | None = None

    def micro(self, rows: slice) -> None:
        """Before the forward of ``rows`` (of this pass's batch)."""
        self._keep()
        self._rows = rows
        if self.model.aux_coeff > 0 and self.model.aux_rows:
            self.model.config.moe_aux_loss_coeff = self.model.aux_coeff / ((self.end - self.first) * self.model.aux_rows)
        target = None
        if self.model.replay and self.routed is not None:
            # [b, s, L, K] -> [L, s, b, K] -> per layer [s * b, K]: megatron's token order
            part = self.routed[rows, self.first:self.end].permute(2, 1, 0, 3)
            target = [t.reshape(-1, t.shape[-1]) for t in part]
        for i, layer in enumerate(self.model.layers):
            layer.target = None if target is None else target[i]
            layer.own = layer.used = None

    def _keep(self) -> None:
        """The last micro-batch's routing into ``own`` / ``used``."""
        rows = self._rows
        if rows is None:
            return
        width = self.end - self.first
        for i, layer in enumerate(self.model.layers):
            for out, got in ((self.own, layer.own), (self.used, layer.used)):
                if got is not None:  # [s * b, K] -> [b, s, K]
                    out[rows, self.first:self.end, i] = got.view(width, -1, got.shape[-1]).transpose(0, 1).cpu().to(out.dtype)
        self._rows = None

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the router's own top-k, the experts used) [B, P+R, L, K] int16, -1 outside the trimmed columns; the
        layers' targets cleared."""
        self._keep()
        for layer in self.model.layers:
            layer.target = None
        return self.own, self.used


def check_routing(spec: Any, router_replay: bool, aux_loss_coeff: float) -> None:
    """One line for routing settings the model cannot take."""
    if aux_loss_coeff < 0:
        raise ValueError(f"train.moe_aux_loss_coeff={aux_loss_coeff} must be >= 0")
    if spec.is_moe:
        return
    if router_replay:
        raise ValueError(f"train.router_replay=replay replays a mixture of experts' routing, but the model "
                         f"({spec.family}) has a dense MLP; set train.router_replay=off")
    if aux_loss_coeff > 0:
        raise ValueError(f"train.moe_aux_loss_coeff={aux_loss_coeff} balances a mixture of experts' routing, but the "
                         f"model ({spec.family}) has a dense MLP; set train.moe_aux_loss_coeff=0")


def mismatch_counts(own: torch.Tensor, routed: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[entries whose top-k set differs, entries compared] over the real tokens' recorded (token, layer) entries."""
    recorded = (routed >= 0).all(-1) & attention_mask.bool().unsqueeze(-1)
    differs = (own.sort(-1).values != routed.to(own.dtype).sort(-1).values).any(-1)
    return torch.tensor([float((differs & recorded).sum()), float(recorded.sum())], dtype=torch.float64)
