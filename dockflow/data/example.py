"""The unit every dataset yields: one prompt, its reference answer, and the row's other columns.

    ex = Example(prompt="What is 47 - 85?", answer="-38")
    ex = Example("Write f.", "", fields={"tests": "assert f(2) == 4"})   # columns reward functions get as kwargs
    ex = Example([{"role": "user", "content": "What is 2 + 2?"}], "4")   # conversational (dockflow.data.messages)
    columns_of([ex], answer_key="solution")   # ['solution', ...the fields' names]: what reward functions get
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Example:
    """A prompt (before templating: a string, or a list of chat messages), the reference answer the verifier
    compares against, and the row's other columns (passed to reward functions by name, as TRL passes dataset
    columns)."""

    prompt: str | list[dict[str, Any]]
    answer: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskData:
    """The splits of a task.

    ``train``: RL prompts (their answers feed the verifier reward only). ``labeled``: the subset of
    ``train`` whose answers SFT may learn from. ``val``: labeled prompts for SFT early stopping,
    disjoint from ``train``. ``test``: held-out prompts, never seen by SFT or RL.
    """

    train: list[Example]
    labeled: list[Example]
    val: list[Example]
    test: list[Example]


def columns_of(examples: Sequence[Example], answer_key: str = "answer") -> list[str]:
    """The keyword columns reward functions get for these rows, as TRL passes a dataset's columns: the reference
    answer under ``answer_key`` (``data.answer_key``), then every other column any row has, in order of first
    appearance (a row without one gets None)."""
    names = dict.fromkeys(k for ex in examples for k in ex.fields if k != answer_key)
    return [answer_key, *names]
