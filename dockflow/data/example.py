"""The unit every dataset yields: one prompt and its reference answer, both as text.

    ex = Example(prompt="What is 47 - 85?", answer="-38")
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    """A prompt (before templating) and the reference answer the verifier compares against."""

    prompt: str
    answer: str


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
