"""The run's length policy, checked where a worker holds the tokenizer and the train prompts: no templated prompt over
``data.max_prompt_tokens``, and the longest prompt plus ``rollout.max_new_tokens`` within the model's context
(``max_position_embeddings``), each refused in one line that names the prompt and what to change."""

from __future__ import annotations

from typing import Any


class LengthPolicyError(ValueError):
    """A train prompt is too long for the run's settings or the model; the message names it and the fix."""


def check_prompt_lengths(templated: list[str], tokenizer: Any, max_prompt_tokens: int | None, max_new_tokens: int,
                         context: int | None) -> int:
    """The longest prompt's token count, after checking it against the limit and the model's ``context``."""
    lengths = [len(ids) for ids in tokenizer(templated, add_special_tokens=False)["input_ids"]]
    if not lengths:
        return 0
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    if max_prompt_tokens is not None:
        over = next((i for i, n in enumerate(lengths) if n > max_prompt_tokens), None)
        if over is not None:
            count = sum(n > max_prompt_tokens for n in lengths)
            raise LengthPolicyError(
                f"train prompt {over} has {lengths[over]} tokens, over data.max_prompt_tokens={max_prompt_tokens} "
                f"({count} of {len(lengths)} prompts are): shorten or drop them, or raise the limit")
    if context is not None and lengths[longest] + max_new_tokens > context:
        raise LengthPolicyError(
            f"train prompt {longest} has {lengths[longest]} tokens; with rollout.max_new_tokens={max_new_tokens} it "
            f"needs {lengths[longest] + max_new_tokens} positions, over the model's context of {context} "
            "(max_position_embeddings): lower rollout.max_new_tokens or set data.max_prompt_tokens")
    return lengths[longest]
