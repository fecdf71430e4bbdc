"""Built-in reward functions, by the name ``reward.functions[].name`` gives them. Each has TRL's signature, so
it is called exactly as a user's function is (``dockflow.rewards.functions``); those marked ``@reads_reference``
get the row's reference answer as ``answer`` whatever ``data.answer_key`` calls its column.

    math_verify(["What is 2 + 2?"], ["4"], answer=["4"])   # [1.0]
    math_verify([[{"role": "user", "content": "2 + 2?"}]], [[{"role": "assistant", "content": "4"}]], answer=["4"])
"""

from __future__ import annotations

from typing import Any

from dockflow.rewards.functions import completion_text, reads_reference
from dockflow.rewards.math_verify import verify

BUILTINS: dict[str, str] = {
    "math_verify": "dockflow.rewards.builtins:math_verify",  # the arithmetic and file tasks' verifier
    "code_tests": "dockflow.rewards.code_tests:code_tests",  # the row's tests run in a sandbox (docs/sandbox.md)
    "reasoning_gym": "dockflow.rewards.reasoning_gym_scorer:reasoning_gym_score",  # reasoning-gym's own scorer
}


@reads_reference
def math_verify(prompts: list[Any], completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 where the completion (text, or TRL's conversational ``[{"role": "assistant", "content": ...}]``)
    answers the row's reference ``answer`` (``dockflow.rewards.math_verify``), else 0.0."""
    return [verify(completion_text(c), a) for c, a in zip(completions, answer, strict=True)]
