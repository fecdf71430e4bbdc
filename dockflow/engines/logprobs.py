"""Response log-probs from a causal LM, given the rollout layout of ``dockflow.engines.base``.

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


def forward_load(batch: TensorDict) -> tuple[float, float]:
    """(positions, real tokens) that :func:`response_outputs` computes for a batch of rollouts once all-padding
    columns are cut: each distinct prompt once, then every row's responses."""
    ids, mask, keep_r = _trimmed(batch["input_ids"], batch["attention_mask"], batch["responses"].shape[1])
    width = ids.shape[1] - keep_r
    _, prompt_mask, copies = distinct_rows(ids[:, :width], mask[:, :width])
    positions = prompt_mask.numel() + copies.numel() * keep_r
    return float(positions), float(prompt_mask.sum() + mask[:, width:].sum())


def response_log_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_width: int,
    temperature: float = 1.0,
    chunk: int = DEFAULT_CHUNK,
) -> TokenOutputs:
    """Log-prob of each response token and the policy's entropy there ([B, R] each), at the sampling temperature.

    The logits are never whole: the lm_head is applied ``chunk`` tokens at a time from the last hidden state
    (``dockflow.engines.token_head``), in the backward pass too. Positions past the longest response of the batch
    get 0 (they are masked out anyway).
    """
    ids, mask, keep_r = _trimmed(input_ids, attention_mask, response_width)
    hidden = response_outputs(model, ids, mask, keep_r, run=last_hidden)
    head = output_head(model)
    logp, entropy = chunked_log_probs(hidden, head.weight, head.bias, ids[:, -keep_r:], temperature=temperature,
                                    chunk=chunk)
    pad = (0, response_width - keep_r)
    return TokenOutputs(F.pad(logp, pad), F.pad(entropy, pad))


def response_values(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int
) -> TokenOutputs:
    """A critic's value of the state before each response token ([B, R]), from a one-label token head
    (``AutoModelForTokenClassification``): the same positions whose logits predict the token."""
    ids, mask, keep_r = _trimmed(input_ids, attention_mask, response_width)
    values = response_outputs(model, ids, mask, keep_r)[..., 0].float()
    return TokenOutputs(F.pad(values, (0, response_width - keep_r)))


ResponseFn = Callable[[nn.Module, torch.Tensor, torch.Tensor, int], TokenOutputs]
"""(model, input_ids, attention_mask, response width) -> one value per response token [B, R] (and entropy)."""


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
