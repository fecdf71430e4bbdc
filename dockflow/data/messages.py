"""Conversational prompts, as TRL's conversational datasets hold them: a list of ``{"role", "content"}`` messages.

TRL's rule (``trl.data_utils.is_conversational``) decides the format: a prompt is conversational when it is a list
whose first item is a dict with a ``role``. Such a prompt is rendered with the tokenizer's chat template as it is
(``PromptFormat.render``), and reward functions get prompts and completions as message lists (``docs/rewards.md``).

    is_conversational([{"role": "user", "content": "What is 2 + 2?"}])   # True
    prompt_text([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}])
    # 'Be brief.\\n2 + 2?'
"""

from __future__ import annotations

import json
from typing import Any, TypeAlias

Messages: TypeAlias = list[dict[str, Any]]
Prompt: TypeAlias = str | Messages


def is_conversational(prompt: object) -> bool:
    """TRL's rule: a list whose first item is a dict with a ``role`` key."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and "role" in prompt[0]


def message_problem(prompt: list) -> str | None:
    """Why ``prompt`` (a list) is not a list of messages, or None when every item is ``{"role": str,
    "content": str}`` (other keys allowed) and there is at least one."""
    if not prompt:
        return "is an empty list of messages"
    for i, m in enumerate(prompt):
        if not isinstance(m, dict):
            return f"message {i} is {type(m).__name__}, not an object with 'role' and 'content'"
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                got = "missing" if key not in m else type(m[key]).__name__
                return f"message {i} needs a string '{key}' ({got}); messages are {{\"role\": ..., \"content\": ...}}"
        if not m["role"].strip():
            return f"message {i} has an empty 'role'"
    return None


def prompt_text(prompt: Prompt) -> str:
    """The prompt's text: itself, or the messages' contents one per line (for corpora and previews)."""
    return "\n".join(m["content"] for m in prompt) if isinstance(prompt, list) else prompt


def prompt_key(prompt: Prompt) -> str:
    """A canonical string of the prompt (for hashes): itself, or the messages as sorted-key JSON."""
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False) if isinstance(prompt, list) else prompt
