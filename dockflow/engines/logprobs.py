"""Response log-probs from a causal LM, given the rollout layout of ``dockflow.engines.base``."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torch import nn


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as generation used them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def response_log_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_width: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-prob of each response token ([B, R]); logits are divided by the sampling temperature."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        logits_to_keep=response_width + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, -response_width:]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def batched_log_probs(model: nn.Module, batch: TensorDict, chunk: int, temperature: float = 1.0) -> torch.Tensor:
    """:func:`response_log_probs` over ``batch`` in chunks, in eval mode, on the model's device."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        parts = [
            response_log_probs(
                model,
                batch["input_ids"][i : i + chunk].to(device),
                batch["attention_mask"][i : i + chunk].to(device),
                batch["responses"].shape[1],
                temperature,
            ).cpu()
            for i in range(0, batch.batch_size[0], chunk)
        ]
    finally:
        model.train(was_training)
    return torch.cat(parts)
