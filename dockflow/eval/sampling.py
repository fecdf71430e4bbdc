"""pass@k and avg@k of a causal LM: k sampled responses per prompt, each scored by the task's verifier.

Generation goes through the same path as greedy accuracy (``dockflow.eval.greedy``), so prompts are
templated, padded and stopped exactly as in RL rollouts.

    sampled_scores(model, tok, task.test[:100], k=8, temperature=1.0, top_p=1.0, max_new_tokens=8,
                   fmt=PromptFormat.of(cfg.data), batch_size=64, seed=0)   # {"pass@8": .., "avg@8": ..}
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dockflow.data import Example, PromptFormat
from dockflow.engines import SamplingParams
from dockflow.eval.greedy import generate_responses
from dockflow.eval.pass_at_k import sample_scores
from dockflow.rewards.verifier import Verifier, verify_answer


def sampled_scores(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    *,
    k: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    fmt: PromptFormat,
    batch_size: int,
    seed: int,
    verifier: Verifier = verify_answer,
) -> dict[str, float]:
    """``{"pass@<k>", "avg@<k>"}`` over ``examples`` with ``k`` samples each; deterministic given ``seed``.

    ``batch_size``: prompts per generation call and sequences per forward pass. No examples: zeros.
    """
    if k < 1:
        raise ValueError(f"k={k} must be >= 1 (samples per prompt)")
    if not examples:
        return sample_scores([], k)
    prompts = [fmt.render(ex.prompt, tokenizer) for ex in examples]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, n=k)
    responses = generate_responses(model, tokenizer, prompts, params, batch_size, seed)
    correct = [[verifier(r, ex) for r in responses[i * k : (i + 1) * k]] for i, ex in enumerate(examples)]
    return sample_scores(correct, k)
