"""Greedy-decoding accuracy of a causal LM on verifiable examples (used by SFT early stopping and RL eval).

Prompts are templated, left-padded and decoded greedily in batches with the KV cache until EOS or
``max_new_tokens``; only the response tokens are decoded and each is scored with the math verifier.

    acc = greedy_accuracy(model, tokenizer, task.test[:500], batch_size=500, max_new_tokens=8,
                          template=cfg.data.prompt_template)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dockflow.data import Example, apply_template, check_template
from dockflow.rewards import verify


@torch.no_grad()
def greedy_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    batch_size: int,
    max_new_tokens: int,
) -> list[str]:
    """Greedy completions of already-templated ``prompts`` (special tokens stripped)."""
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size={batch_size} and max_new_tokens={max_new_tokens} must both be >= 1")
    was_training = model.training
    model.eval()
    tokenizer.padding_side = "left"
    device = next(model.parameters()).device
    out: list[str] = []
    try:
        for start in range(0, len(prompts), batch_size):
            enc = tokenizer(list(prompts[start : start + batch_size]), return_tensors="pt", padding=True)
            enc = {k: v.to(device) for k, v in enc.items()}
            gen = model.generate(
                **enc,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                use_cache=True,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            out.extend(tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True))
    finally:
        model.train(was_training)
    return out


def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    batch_size: int,
    max_new_tokens: int,
    template: str,
) -> float:
    """Fraction of ``examples`` whose greedy response the verifier accepts (0.0 for no examples)."""
    if not examples:
        return 0.0
    check_template(template)
    prompts = [apply_template(template, ex.prompt) for ex in examples]
    responses = greedy_responses(model, tokenizer, prompts, batch_size, max_new_tokens)
    return sum(verify(r, ex.answer) for r, ex in zip(responses, examples, strict=True)) / len(examples)
