"""Preference pairs for offline algorithms (DPO): a JSONL loader and a synthetic set built from a verifiable task.

A pair is a prompt with a preferred (``chosen``) and a dispreferred (``rejected``) response. User files
hold one JSON object per line with those three string fields; a bad row fails the load with the file and
line. Without a file, pairs come from the task itself: the correct answer is chosen, a plausible wrong
one (the answer off by a small amount) is rejected::

    pairs = load_preference_pairs("data/prefs.jsonl")    # or s3://bucket/prefs.jsonl, storage=cfg.checkpoint
    pairs = synthetic_preferences(task.train, seed=0)
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from dockflow.config import CheckpointConfig
from dockflow.config.algorithm import PreferenceSection
from dockflow.data.example import Example, TaskData
from dockflow.data.loaders import DatasetError, local_copy
from dockflow.data.messages import Prompt

_FIELDS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class PreferencePair:
    prompt: Prompt  # a pairs file's string, or a synthetic pair's task prompt (messages for a conversational task)
    chosen: str
    rejected: str


def _pair(row: object, where: str) -> PreferencePair:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected an object with {list(_FIELDS)}, got {type(row).__name__}")
    for key in _FIELDS:
        value = row.get(key)
        if not isinstance(value, str) or not value.strip():
            raise DatasetError(f"{where}: field '{key}' must be a non-empty string (every row needs {list(_FIELDS)})")
    if row["chosen"].strip() == row["rejected"].strip():
        raise DatasetError(f"{where}: 'chosen' and 'rejected' are the same text, so the pair carries no preference")
    return PreferencePair(row["prompt"], row["chosen"].strip(), row["rejected"].strip())


def load_preference_pairs(
    path: str | Path, storage: CheckpointConfig | None = None, key: str = "the pairs file's path"
) -> list[PreferencePair]:
    """Pairs from a JSONL file (a local path, or ``s3://bucket/key`` fetched with the S3 settings of ``storage``,
    the run's ``cfg.checkpoint``; None: the environment only); blank lines are skipped. ``key``: the config key
    that names the file, for the message when it is missing."""
    name = str(path)
    p = local_copy(path, storage)
    if not p.is_file():
        raise DatasetError(f"preference file '{p}' not found: check {key}")
    out = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{name}:{lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            out.append(_pair(row, f"{name}:{lineno}"))
    if not out:
        raise DatasetError(f"preference file '{name}' has no rows")
    return out


def _wrong_answer(answer: str, rng: random.Random) -> str:
    """A near miss: an integer answer off by 1..10 either way (the mistakes a small model makes)."""
    try:
        value = int(answer)
    except ValueError:
        return answer + "0"
    return str(value + rng.choice([-1, 1]) * rng.randint(1, 10))


def synthetic_preferences(examples: list[Example], seed: int) -> list[PreferencePair]:
    """One pair per example: its answer is chosen, a seeded near miss is rejected."""
    rng = random.Random(seed)
    return [PreferencePair(ex.prompt, ex.answer, _wrong_answer(ex.answer, rng)) for ex in examples]


def preference_splits(
    cfg: PreferenceSection, task: TaskData, seed: int, storage: CheckpointConfig | None = None
) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train pairs, held-out pairs). From ``cfg.pairs_path`` (local or ``s3://``, fetched with ``storage``'s S3
    settings) the first ``num_eval_pairs`` rows are held out; otherwise synthetic pairs are built from the
    task's train split and, for evaluation, its test split."""
    if cfg.pairs_path:
        rows = load_preference_pairs(cfg.pairs_path, storage, cfg.key_of("pairs_path"))
        if len(rows) <= cfg.num_eval_pairs:
            raise DatasetError(
                f"{cfg.pairs_path} has {len(rows)} pairs, not more than {cfg.key_of('num_eval_pairs')}="
                f"{cfg.num_eval_pairs}: lower it so that training pairs remain"
            )
        return rows[cfg.num_eval_pairs :], rows[: cfg.num_eval_pairs]
    return synthetic_preferences(task.train, seed), synthetic_preferences(task.test[: cfg.num_eval_pairs], seed + 1)
