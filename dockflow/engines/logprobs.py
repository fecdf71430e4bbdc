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


def distinct_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, mask) of the distinct rows, and for every row the index of its distinct row: a group's N samples of
    one prompt share one."""
    width = input_ids.shape[1]
    rows = torch.cat([input_ids, attention_mask.to(input_ids.dtype)], dim=1)
    distinct, copies = torch.unique(rows, dim=0, return_inverse=True)
    return distinct[:, :width], distinct[:, width:].to(attention_mask.dtype), copies


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
                     run: Callable[..., torch.Tensor] = model_logits) -> torch.Tensor:
    """``run``'s outputs (:func:`model_logits` or :func:`last_hidden`) at the positions that precede each of the
    last ``keep_r`` columns of the (trimmed) rows, [B, keep_r, ...]: the ones that predict, or value the state
    before, each response token.

    Each distinct prompt goes through the model once (GRPO's N samples of a prompt share it, as their generation
    did), its keys and values are copied to its rows, and the responses then attend to them: the same causal
    attention as one pass over prompt and response, with the prompt's share of the compute divided by N,
    gradients included.
    """
    from transformers.cache_utils import DynamicCache  # here: importing dockflow.engines stays light

    width = ids.shape[1] - keep_r
    prompt_ids, prompt_mask, copies = distinct_rows(ids[:, :width], mask[:, :width])
    cache = DynamicCache(config=model.config)
    last_prompt = run(
        model, input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=position_ids_from_mask(prompt_mask),
        past_key_values=cache, use_cache=True,
    )[:, -1:]
    cache.batch_select_indices(copies)
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
                    run: Callable[..., torch.Tensor]) -> torch.Tensor:
    """``run``'s outputs before each response token [B, keep_r, ...], packed or through the shared-prompt pass:
    the same values either way."""
    layout = packed_outputs if pack else response_outputs
    return layout(model, ids, mask, keep_r, run=run)


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
) -> TokenOutputs:
    """Log-prob of each response token and the policy's entropy there ([B, R] each), at the sampling temperature.

    The logits are never whole: the lm_head is applied ``chunk`` tokens at a time from the last hidden state
    (``dockflow.engines.token_head``), in the backward pass too, and on the real response tokens only. Padding
    positions get 0 (they are masked out anyway). ``pack``: through one packed pass or the shared-prompt pass (None:
    :func:`packs` decides).
    """
    pack = packs(model, input_ids, attention_mask, response_width) if pack is None else pack
    ids, mask, keep_r = _trimmed(input_ids, attention_mask, response_width)
    hidden = _layout_outputs(model, ids, mask, keep_r, pack, run=last_hidden)
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
entropy): :func:`response_log_probs` or :func:`response_values`."""


@torch.no_grad()
def batched_response_outputs(model: nn.Module, batch: TensorDict, chunk: int, fn: ResponseFn) -> torch.Tensor:
    """``fn`` over ``batch`` in chunks, in eval mode, on the model's device."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        parts = [
            fn(
                model,
                batch["input_ids"][i : i + chunk].to(device),
                batch["attention_mask"][i : i + chunk].to(device),
                batch["responses"].shape[1],
            ).values.cpu()
            for i in range(0, batch.batch_size[0], chunk)
        ]
    finally:
        model.train(was_training)
    return torch.cat(parts)


def batched_log_probs(model: nn.Module, batch: TensorDict, chunk: int, temperature: float = 1.0) -> torch.Tensor:
    """:func:`response_log_probs` over ``batch`` in chunks, without gradients."""
    return batched_response_outputs(model, batch, chunk, partial(response_log_probs, temperature=temperature))
