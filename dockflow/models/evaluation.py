"""Greedy-decoding accuracy of a causal LM on verifiable examples (used by SFT early stopping and RL eval).

Prompts are templated, left-padded and decoded greedily in batches with the KV cache until EOS or
``max_new_tokens``; only the response tokens are decoded and each is scored with the math verifier.

    acc = greedy_accuracy(model, tokenizer, task.test[:500], batch_size=500, max_new_tokens=8,
                          template=cfg.data.prompt_template)
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dockflow.data import Example, apply_template, check_template
from dockflow.engines import HFGenerationEngine, SamplingParams
from dockflow.rewards import verify


def greedy_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    batch_size: int,
    max_new_tokens: int,
) -> list[str]:
    """Greedy completions of already-templated ``prompts`` (special tokens stripped).

    Runs through the same generation engine as RL rollouts, so SFT validation, RL evaluation and
    rollouts encode, pad and stop identically.
    """
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size={batch_size} and max_new_tokens={max_new_tokens} must both be >= 1")
    device = next(model.parameters()).device
    engine = HFGenerationEngine(model, tokenizer, device=device, batch_size=batch_size)
    params = SamplingParams(max_new_tokens=max_new_tokens, greedy=True)
    out: list[str] = []
    for start in range(0, len(prompts), batch_size):
        roll = engine.generate(list(prompts[start : start + batch_size]), params, seed=0)
        out.extend(engine.decode(roll["responses"], roll["response_mask"]))
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
