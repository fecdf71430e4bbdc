"""Response log-probs from a causal LM, given the rollout layout of ``dockflow.engines.base``.

Rollouts are stored at a fixed width (prompt width P + ``max_new_tokens``); before a forward pass the
columns that are padding in every row of the batch are cut off (left of the prompts, right of the
responses), so compute follows the real lengths. The result is padded back to the stored width.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn


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


def response_log_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_width: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-prob of each response token ([B, R]); logits are divided by the sampling temperature.

    Positions past the longest response of the batch get log-prob 0 (they are masked out anyway).
    """
    ids, mask, keep_r = _trimmed(input_ids, attention_mask, response_width)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=position_ids_from_mask(mask),
        logits_to_keep=keep_r + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = ids[:, -keep_r:]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return F.pad(logp, (0, response_width - keep_r))


def response_values(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int
) -> torch.Tensor:
    """A critic's value of the state before each response token ([B, R]), from a one-label token head
    (``AutoModelForTokenClassification``): the same positions whose logits predict the token."""
    ids, mask, keep_r = _trimmed(input_ids, attention_mask, response_width)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False)
    values = out.logits[:, -keep_r - 1 : -1, 0].float()
    return F.pad(values, (0, response_width - keep_r))


ResponseFn = Callable[[nn.Module, torch.Tensor, torch.Tensor, int], torch.Tensor]
"""(model, input_ids, attention_mask, response width) -> one value per response token [B, R]."""


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
            ).cpu()
            for i in range(0, batch.batch_size[0], chunk)
        ]
    finally:
        model.train(was_training)
    return torch.cat(parts)


def batched_log_probs(model: nn.Module, batch: TensorDict, chunk: int, temperature: float = 1.0) -> torch.Tensor:
    """:func:`response_log_probs` over ``batch`` in chunks, without gradients."""
    return batched_response_outputs(model, batch, chunk, partial(response_log_probs, temperature=temperature))
