"""What defines a task, for the Model Registry's lineage check, and a content hash of examples.

    task_identity(cfg.data, task.val + task.train)   # "arithmetic digits=2 ops=+-"
    examples_hash(task.test[:500])                  # "3f1c09a2b4d5e6f7"

A task is what its generator is asked for (the arithmetic or reasoning-gym settings that shape the problems,
not the seed that draws them, nor how many), or for user files the content of the train file. Two runs whose
identities differ trained on different tasks, and the registry does not rank one against the other.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence

from dockflow.config.data import DataConfig
from dockflow.data.example import Example
from dockflow.data.messages import prompt_key

HASH_CHARS = 16


def short_hash(parts: Iterable[str]) -> str:
    """sha256 of ``parts`` (each length-prefixed, so no two lists collide), as 16 hex characters."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:HASH_CHARS]


def examples_hash(examples: Sequence[Example]) -> str:
    """Hash of the prompts (messages as sorted-key JSON) and reference answers of ``examples``, in order."""
    return short_hash(text for ex in examples for text in (prompt_key(ex.prompt), ex.answer))


def task_identity(data: DataConfig, rows: Sequence[Example]) -> str:
    """One line naming the task: ``data.source`` and what defines it (``rows``: the train file's rows, hashed
    for ``source: file``; not read for the generated tasks)."""
    if data.source == "arithmetic":
        return f"arithmetic digits={data.arithmetic.digits} ops={''.join(sorted(set(data.arithmetic.ops)))}"
    if data.source == "reasoning_gym":
        rg = data.reasoning_gym
        options = json.dumps(rg.options, sort_keys=True, default=str)
        return f"reasoning_gym {rg.name} options={short_hash([options])} short_prompt={rg.short_prompt}"
    return f"file train={examples_hash(rows)}"
