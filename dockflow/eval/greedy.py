"""Greedy-decoding accuracy of a causal LM on verifiable examples (used by SFT early stopping and RL eval).

Prompts are templated, left-padded and decoded greedily in batches with the KV cache until EOS or
``max_new_tokens``; only the response tokens are decoded and each is scored with the task's verifier
(``dockflow.rewards.verifier``: the math verifier unless the task brings its own).
``generate_responses`` is the shared generation path (greedy here, k samples in ``dockflow.eval``).

    acc = greedy_accuracy(model, tokenizer, task.test[:500], batch_size=500, max_new_tokens=8,
                          fmt=PromptFormat.of(cfg.data), verifier=task_verifier(cfg.data))
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dockflow.data import Example, PromptFormat
from dockflow.engines import HFGenerationEngine, SamplingParams
from dockflow.rewards.verifier import Verifier, verify_answer


def rng_guard(device: torch.device) -> AbstractContextManager[None]:
    """Keep the caller's RNG as it was: the engine seeds the global generator of ``device`` per chunk."""
    if device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=[device.index or 0], device_type=device.type)


def generate_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    params: SamplingParams,
    batch_size: int,
    seed: int = 0,
) -> list[str]:
    """``params.n`` completions per already-templated prompt (contiguous per prompt, special tokens stripped).

    Runs through the same generation engine as RL rollouts, so SFT validation, RL evaluation and
    rollouts encode, pad and stop identically. ``batch_size`` prompts go to the engine at a time, chunk
    ``i`` with seed ``seed + i * batch_size``: deterministic given the seed. The caller's RNG is left as it was.
    """
    if batch_size < 1 or params.max_new_tokens < 1:
        raise ValueError(f"batch_size={batch_size} and max_new_tokens={params.max_new_tokens} must both be >= 1")
    device = next(model.parameters()).device
    engine = HFGenerationEngine(model, tokenizer, device=device, batch_size=batch_size)
    out: list[str] = []
    with rng_guard(device):
        for start in range(0, len(prompts), batch_size):
            roll = engine.generate(list(prompts[start : start + batch_size]), params, seed=seed + start)
            out.extend(engine.decode(roll["responses"], roll["response_mask"]))
    return out


def greedy_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    batch_size: int,
    max_new_tokens: int,
) -> list[str]:
    """Greedy completions of already-templated ``prompts`` (special tokens stripped)."""
    params = SamplingParams(max_new_tokens=max_new_tokens, greedy=True)
    return generate_responses(model, tokenizer, prompts, params, batch_size)


def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    batch_size: int,
    max_new_tokens: int,
    fmt: PromptFormat,
    verifier: Verifier = verify_answer,
) -> float:
    """Fraction of ``examples`` whose greedy response ``verifier`` (the task's) accepts (0.0 for no examples)."""
    if not examples:
        return 0.0
    prompts = [fmt.render(ex.prompt, tokenizer) for ex in examples]
    responses = greedy_responses(model, tokenizer, prompts, batch_size, max_new_tokens)
    return sum(verifier(r, ex) for r, ex in zip(responses, examples, strict=True)) / len(examples)
