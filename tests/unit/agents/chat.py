"""Helpers of the agents tests. A tokenizer whose chat template supports tools, built locally: the tiny model's character tokenizer with
Qwen2.5's ChatML tokens and Qwen2.5's own chat template (the copy TRL ships and recognises)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from transformers import PreTrainedTokenizerFast
from trl.chat_template_utils import qwen2_5_chat_template


def qwen_style(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer


def scripted(tokenizer: PreTrainedTokenizerFast, turns: Sequence[str]) -> tuple[Callable, list[list[int]]]:
    """A ``generate`` that answers each call with the next text of ``turns`` (encoded, then EOS), and the list of
    the ids it returned."""
    emitted: list[list[int]] = []

    def generate(ids: list[int], max_new_tokens: int) -> list[int]:
        new = tokenizer.encode(turns[len(emitted)], add_special_tokens=False) + [tokenizer.eos_token_id]
        emitted.append(new[:max_new_tokens])
        return new

    return generate, emitted


def call(name: str, arguments: str) -> str:
    """A tool call as Qwen2.5's template renders one."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'
