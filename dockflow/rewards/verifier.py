"""The task's own verifier: what held-out accuracy, SFT validation, the best checkpoint and the champion score
count as correct. It is fixed by the task (``data.source``), not by ``reward.functions``: a run's reward may
mix in a user's shaping terms, but its accuracy is always measured the same way, so runs stay comparable.

    verifier = task_verifier(cfg.data)
    verifier("-38", Example("What is 47 - 85?", "-38"))   # 1.0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dockflow.rewards.math_verify import verify

if TYPE_CHECKING:
    from dockflow.config import DataConfig
    from dockflow.data import Example

Verifier = Callable[[str, "Example"], float]
"""(response text, example) -> 1.0 if the response is correct, else 0.0."""


def verify_answer(response: str, example: Example) -> float:
    """The math verifier against the example's reference answer (arithmetic and file tasks)."""
    return verify(response, example.answer)


def verifier_name(data: DataConfig) -> str:
    """The name of ``task_verifier(data)``: ``reasoning_gym:<task>`` (its scorer is the task's), else ``math_verify``."""
    if data.source == "reasoning_gym":
        return f"reasoning_gym:{data.reasoning_gym.name}"
    return "math_verify"


def task_verifier(data: DataConfig) -> Verifier:
    """The verifier of ``data.source``: reasoning-gym's own scorer for its tasks, else the math verifier."""
    if data.source == "reasoning_gym":
        from dockflow.rewards.reasoning_gym_scorer import verify_example

        return verify_example
    return verify_answer
