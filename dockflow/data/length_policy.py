"""The run's length policy for train prompts: none over ``data.max_prompt_tokens`` (refused in one line that names the
first, or left out of the prompt order with the count logged: ``data.overlong_prompts``), and the longest prompt kept
plus ``rollout.max_new_tokens`` within the model's context (``max_position_embeddings``).

The driver works out which prompts are left out before any worker starts
(``rollout/prompts.py: overlong_train_prompts``: the prompt order and the rollout queue are built from it); each
worker that holds the prompts checks them again as it starts (:func:`check_prompt_lengths`), so a tokenizer that
differs from the driver's cannot slip a prompt through.
"""

from __future__ import annotations

from typing import Any

from dockflow.config.data import DataConfig


class LengthPolicyError(ValueError):
    """A train prompt is too long for the run's settings or the model; the message names it and the fix."""


def check_prompt_lengths(templated: list[str], tokenizer: Any, data: DataConfig, max_new_tokens: int,
                         context: int | None) -> list[int]:
    """The indices of the prompts the policy leaves out (sorted; none unless ``data.overlong_prompts`` is
    ``filter``), after checking the prompts kept against the limit and the model's ``context``."""
    lengths = [len(ids) for ids in tokenizer(templated, add_special_tokens=False)["input_ids"]]
    limit = data.max_prompt_tokens
    over = [i for i, n in enumerate(lengths) if limit is not None and n > limit]
    if over and data.overlong_prompts == "refuse":
        raise LengthPolicyError(
            f"train prompt {over[0]} has {lengths[over[0]]} tokens, over data.max_prompt_tokens={limit} "
            f"({len(over)} of {len(lengths)} prompts are): shorten or drop them, raise the limit, or set "
            "data.overlong_prompts=filter")
    if len(over) == len(lengths) and lengths:
        raise LengthPolicyError(f"all {len(lengths)} train prompts are over data.max_prompt_tokens={limit}: "
                                "raise the limit")
    skipped = set(over)
    kept = [i for i in range(len(lengths)) if i not in skipped]
    if kept and context is not None:
        longest = max(kept, key=lengths.__getitem__)
        if lengths[longest] + max_new_tokens > context:
            raise LengthPolicyError(
                f"train prompt {longest} has {lengths[longest]} tokens; with rollout.max_new_tokens={max_new_tokens} "
                f"it needs {lengths[longest] + max_new_tokens} positions, over the model's context of {context} "
                "(max_position_embeddings): lower rollout.max_new_tokens or set data.max_prompt_tokens")
    return over
