"""Response log-probs from a causal LM, given the rollout layout of ``dockflow.engines.interfaces``.

Rollouts are stored at a fixed width (prompt width P + ``max_new_tokens``); before a forward pass the
columns that are padding in every row of the batch are cut off (left of the prompts, right of the
responses), so compute follows the real lengths. The result is padded back to the stored width.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

from dockflow.engines.packing import PackingCost, packed_outputs, packing_pays
from dockflow.engines.routing import RouterReplay, Routing, batch_routing
from dockflow.engines.token_head import DEFAULT_CHUNK, chunked_log_probs, output_head


class TokenOutputs(NamedTuple):
    """One value per response token [B, R] (log-probs, or a critic's values), and the policy's entropy per token
    (None for a critic)."""

    values: torch.Tensor
    entropy: torch.Tensor | None = None


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as generation used them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def trim_columns(attention_mask: torch.Tensor, response_width: int) -> tuple[int, int]:
    """(first column to keep, response columns to keep): drop all-padding columns at both ends."""
    prompt_mask = attention_mask[:, :-response_width]
    used = prompt_mask.any(dim=0).nonzero()
    first = int(used[0]) if len(used) else prompt_mask.shape[1]
    resp_used = attention_mask[:, -response_width:].any(dim=0).nonzero()
    keep_r = int(resp_used[-1]) + 1 if len(resp_used) else 1
    return first, keep_r


def _trimmed(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int):
    """(ids, mask, kept response columns) with the all-padding columns of the batch cut off."""
    first, keep_r = trim_columns(attention_mask, response_width)
    end = input_ids.shape[1] - response_width + keep_r
    return input_ids[:, first:end], attention_mask[:, first:end], keep_r


def _trimmed_routing(routing: Routing | None, attention_mask: torch.Tensor, response_width: int) -> Routing | None:
    """``routing`` cut to the columns :func:`_trimmed` keeps."""
    if routing is None:
        return None
    first, keep_r = trim_columns(attention_mask, response_width)
    return routing.cut(columns=slice(first, attention_mask.shape[1] - response_width + keep_r))


def distinct_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  key: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, mask) of the distinct rows, and for every row the index of its distinct row: a group's N samples of
    one prompt share one. ``key`` [B, ...]: what else rows must share to be one (their recorded routing)."""
    width = input_ids.shape[1]
    rows = torch.cat([input_ids, attention_mask.to(input_ids.dtype), *(() if key is None else (key,))], dim=1)
    distinct, copies = torch.unique(rows, dim=0, return_inverse=True)
    return distinct[:, :width], distinct[:, width : 2 * width].to(attention_mask.dtype), copies


def model_logits(model: nn.Module, **inputs: Any) -> torch.Tensor:
    """The model's outputs (``.logits``) at every position: a critic's value head, [B, T, 1]."""
    return model(**inputs).logits


def last_hidden(model: nn.Module, **inputs: Any) -> torch.Tensor:
    """A causal LM's last hidden state (after the final norm) at every position, [B, T, H]: what its lm_head maps
    to logits. The model runs as a whole (so FSDP's hooks run) with ``logits_to_keep=1``: the head computes one
    position, and the decoder's output is read by a forward hook."""
    captured: list[torch.Tensor] = []
    handle = model.get_decoder().register_forward_hook(lambda _m, _i, out: captured.append(out.last_hidden_state))
    try:
        model(**inputs, logits_to_keep=1)
    finally:
        handle.remove()
    return captured[-1]


def response_outputs(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, keep_r: int,
                     run: Callable[..., torch.Tensor] = model_logits, *, routing: Routing | None = None) -> torch.Tensor:
    """``run``'s outputs (:func:`model_logits` or :func:`last_hidden`) at the positions that precede each of the
    last ``keep_r`` columns of the (trimmed) rows, [B, keep_r, ...]: the ones that predict, or value the state
    before, each response token.

    Each distinct prompt goes through the model once (GRPO's N samples of a prompt share it, as their generation
    did), its keys and values are copied to its rows, and the responses then attend to them: the same causal
    attention as one pass over prompt and response, with the prompt's share of the compute divided by N,
    gradients included. With ``routing`` (replayed experts), rows share a prompt pass only where their recorded
    prompt routing is the same too.
    """
    from transformers.cache_utils import DynamicCache  # here: importing dockflow.engines stays light

    width = ids.shape[1] - keep_r
    key = None if routing is None else routing.experts[:, :width].reshape(len(ids), -1).to(ids.dtype)
    prompt_ids, prompt_mask, copies = distinct_rows(ids[:, :width], mask[:, :width], key)
    if routing is not None:  # a row of each distinct prompt: its recorded prompt routing
        first = torch.empty(len(prompt_ids), dtype=torch.long, device=copies.device)
        first.scatter_(0, copies, torch.arange(len(copies), device=copies.device))
        routing.cut(rows=first, columns=slice(None, width)).feed()
    cache = DynamicCache(config=model.config)
    last_prompt = run(
        model, input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=position_ids_from_mask(prompt_mask),
        past_key_values=cache, use_cache=True,
    )[:, -1:]
    cache.batch_select_indices(copies)
    if routing is not None:
        routing.cut(columns=slice(width, None)).feed()
    responses = run(
        model, input_ids=ids[:, width:], attention_mask=mask, position_ids=position_ids_from_mask(mask)[:, width:],
        past_key_values=cache, use_cache=True,
    )
    return torch.cat([last_prompt[copies], responses[:, :-1]], dim=1)


def _shared_prompt_load(ids: torch.Tensor, mask: torch.Tensor, keep_r: int) -> tuple[float, float]:
    """(positions, real tokens) :func:`response_outputs` computes: each distinct prompt once, then every row's
    responses."""
    width = ids.shape[1] - keep_r
    _, prompt_mask, copies = distinct_rows(ids[:, :width], mask[:, :width])
    return float(prompt_mask.numel() + copies.numel() * keep_r), float(prompt_mask.sum() + mask[:, width:].sum())


def packs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int) -> bool:
    """Whether these rollouts go through the model packed (``engines/packing.py``): always under gradient
    checkpointing in training (it drops the KV cache the shared-prompt pass needs), otherwise where packing costs
    less (``packing_pays``). A data-parallel engine makes its ranks agree before passing ``pack=``."""
    if model.training and getattr(model, "is_gradient_checkpointing", False):
        return True
    ids, mask, keep_r = _trimmed(input_ids, attention_mask, response_width)
    return packing_pays(mask, keep_r, _shared_prompt_load(ids, mask, keep_r)[0], PackingCost.of(model))


def _layout_outputs(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, keep_r: int, pack: bool,
                    run: Callable[..., torch.Tensor], routing: Routing | None = None) -> torch.Tensor:
    """``run``'s outputs before each response token [B, keep_r, ...], packed or through the shared-prompt pass:
    the same values either way (``routing``: the trimmed rows' recorded experts, replayed in both)."""
    layout = packed_outputs if pack else response_outputs
    return layout(model, ids, mask, keep_r, run=run, routing=routing)


def forward_load(batch: TensorDict, pack: bool) -> tuple[float, float]:
    """(positions, real tokens) computed for a batch of rollouts once all-padding columns are cut: packed, its real
    tokens; otherwise each distinct prompt once, then every row's responses."""
    ids, mask, keep_r = _trimmed(batch["input_ids"], batch["attention_mask"], batch["responses"].shape[1])
    if pack:
        return float(mask.sum()), float(mask.sum())
    return _shared_prompt_load(ids, mask, keep_r)


def response_log_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_width: int,
    temperature: float = 1.0,
    chunk: int = DEFAULT_CHUNK,
    pack: bool | None = None,
    *,
    routing: Routing | None = None,
) -> TokenOutputs:
    """Log-prob of each response token and the policy's entropy there ([B, R] each), at the sampling temperature.

    The logits are never whole: the lm_head is applied ``chunk`` tokens at a time from the last hidden state
    (``dockflow.engines.token_head``), in the backward pass too, and on the real response tokens only. Padding
    positions get 0 (they are masked out anyway). ``pack``: through one packed pass or the shared-prompt pass (None:
    :func:`packs` decides). ``routing``: the rows' recorded experts (``engines/routing.py``), fed to the routers.
    """
    pack = packs(model, input_ids, attention_mask, response_width) if pack is None else pack
    ids, mask, keep_r = _trimmed(input_ids, attention_mask, response_width)
    routing = _trimmed_routing(routing, attention_mask, response_width)
    hidden = _layout_outputs(model, ids, mask, keep_r, pack, run=last_hidden, routing=routing)
    head = output_head(model)
    real = mask[:, -keep_r:].bool()  # the head runs on real response tokens only: padding costs it nothing
    token_logp, token_entropy = chunked_log_probs(hidden[real], head.weight, head.bias, ids[:, -keep_r:][real],
                                                  temperature=temperature, chunk=chunk)
    shape = (ids.shape[0], response_width)
    logp = torch.zeros(shape, dtype=token_logp.dtype, device=ids.device).masked_scatter(
        F.pad(real, (0, response_width - keep_r)), token_logp)
    entropy = torch.zeros(shape, dtype=token_entropy.dtype, device=ids.device)
    entropy[:, :keep_r][real] = token_entropy
    return TokenOutputs(logp, entropy)


def response_values(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int,
    pack: bool | None = None,
) -> TokenOutputs:
    """A critic's value of the state before each response token ([B, R]), from a one-label token head
    (``AutoModelForTokenClassification``): the same positions whose logits predict the token."""
    pack = packs(model, input_ids, attention_mask, response_width) if pack is None else pack
    ids, mask, keep_r = _trimmed(input_ids, attention_mask, response_width)
    values = _layout_outputs(model, ids, mask, keep_r, pack, run=model_logits)[..., 0].float()
    return TokenOutputs(F.pad(values, (0, response_width - keep_r)))


ResponseFn = Callable[..., TokenOutputs]
"""(model, input_ids, attention_mask, response width, pack=None) -> one value per response token [B, R] (and
entropy): :func:`response_log_probs` or :func:`response_values`; a policy's also takes ``routing=``."""


@torch.no_grad()
def batched_response_outputs(model: nn.Module, batch: TensorDict, chunk: int, fn: ResponseFn,
                             replay: RouterReplay | None = None) -> torch.Tensor:
    """``fn`` over ``batch`` in chunks, in eval mode, on the model's device; with ``replay`` and the batch's
    ``routed_experts``, each chunk's routing goes with it."""
    device = next(model.parameters()).device
    was_training = model.training
    routing = batch_routing(replay, batch)
    model.eval()
    try:
        parts = []
        for i in range(0, batch.batch_size[0], chunk):
            rows = slice(i, i + chunk)
            extra = {} if routing is None else {"routing": routing.cut(rows=rows)}
            ids, mask = batch["input_ids"][rows].to(device), batch["attention_mask"][rows].to(device)
            parts.append(fn(model, ids, mask, batch["responses"].shape[1], **extra).values.cpu())
    finally:
        model.train(was_training)
        if replay is not None:
            replay.clear()
    return torch.cat(parts)


def batched_log_probs(model: nn.Module, batch: TensorDict, chunk: int, temperature: float = 1.0,
                      replay: RouterReplay | None = None) -> torch.Tensor:
    """:func:`response_log_probs` over ``batch`` in chunks, without gradients (``replay``: its recorded experts)."""
    return batched_response_outputs(model, batch, chunk, partial(response_log_probs, temperature=temperature), replay)
