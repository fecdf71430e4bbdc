"""reasoning-gym's own scorers as a reward function (TRL's signature) and as the task's verifier.

The answer is what the completion puts between ``<answer>`` tags (reasoning-gym's extractor), else its first
line: the tiny model answers right after "Answer: " and stops. Before a scorer sees it, an answer must pass the
task's guard, because some scorers evaluate it (countdown's runs sympy's ``parse_expr``, an ``eval``):
countdown accepts only digits, ``+ - * / ( )`` and spaces, at most 64 characters and no ``**`` (``9**9**9``
would never finish); every task bounds the length. An answer that fails the guard scores as no answer.

    reasoning_gym_score(["Make 24 from 2 3 4.\\nAnswer: "], ["2*3*4"], metadata=[ex.fields["metadata"]])  # [1.0]
    verify_example("2*3*4", ex)   # 1.0

The reward keeps the scorer's partial credit (countdown: 1.0 solved, 0.05 any well-formed expression, 0.01
no expression): it is reasoning-gym's reward as its authors meant it, and it is small enough that GRPO's
groups still rank a solution far above a well-formed miss. Accuracy counts full credit only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from dockflow.rewards.functions import completion_text, reads_reference

if TYPE_CHECKING:
    from dockflow.data import Example

MAX_ANSWER_CHARS = 1000
_GUARDS: dict[str, re.Pattern[str]] = {"countdown": re.compile(r"[0-9+\-*/() ]{1,64}")}
_TAG = "<answer>"


@cache
def _scorer(name: str) -> Callable[[str | None, dict[str, Any]], float]:
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(name)


def extract_answer(completion: str) -> str:
    """The answer in ``completion``: the last ``<answer>...</answer>``, else the first line, stripped."""
    if _TAG in completion:
        from reasoning_gym.utils import extract_answer as tagged

        found = tagged(completion)
        if found is not None:
            return found
    lines = completion.strip().splitlines()
    return lines[0].strip() if lines else ""


def safe_answer(name: str, answer: str) -> str | None:
    """``answer`` if the task's scorer may see it, else None (too long, or outside the task's grammar)."""
    if len(answer) > MAX_ANSWER_CHARS:
        return None
    guard = _GUARDS.get(name)
    if guard is not None and (not guard.fullmatch(answer) or "**" in answer):
        return None
    return answer


def score_completion(completion: str, metadata: dict[str, Any], reference: str | None = None) -> float:
    """reasoning-gym's score of one completion for the entry that ``metadata`` describes."""
    name = metadata["source_dataset"]
    entry = {"metadata": metadata, "answer": reference}
    return float(_scorer(name)(safe_answer(name, extract_answer(completion)), entry))


@reads_reference
def reasoning_gym_score(
    prompts: Sequence[Any], completions: Sequence[Any], metadata: Sequence[dict[str, Any] | None],
    answer: Sequence[str | None] | None = None, **kwargs: Any,
) -> list[float | None]:
    """Reward: reasoning-gym's scorer on each completion (partial credit as the scorer gives it), given the row's
    reference ``answer`` where there is one; None for a row without reasoning-gym metadata (not applicable, as in
    TRL)."""
    answers = answer or [None] * len(completions)
    return [
        None if not meta else score_completion(completion_text(c), meta, ref)
        for c, meta, ref in zip(completions, metadata, answers, strict=True)
    ]


def verify_example(response: str, example: Example) -> float:
    """Verifier: 1.0 iff reasoning-gym's scorer gives ``response`` full credit on ``example``, else 0.0."""
    meta = example.fields.get("metadata")
    if not meta:
        raise ValueError(f"example {example.prompt!r} has no reasoning-gym metadata in fields['metadata']")
    return 1.0 if score_completion(response, meta, example.answer) >= 1.0 else 0.0
