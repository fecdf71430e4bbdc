"""Datasets for RL post-training: the synthetic arithmetic task, reasoning-gym tasks, user JSONL/Parquet
files, templates.

One entry point builds every split a run needs::

    task = load_task(cfg.data, seed=cfg.run.seed, storage=cfg.checkpoint)
    task.train, task.labeled, task.val, task.test     # lists of Example(prompt, answer)
    task_columns(cfg.data, seed=cfg.run.seed)        # the columns reward functions get: ['answer', ...]

A file's prompts may be strings or, as in TRL's conversational datasets, lists of ``{"role", "content"}`` messages
(rendered with the tokenizer's chat template: ``data.chat_template: true``; ``check_conversational``).
``data.train_path``/``data.test_path`` may be ``s3://bucket/key`` URIs: they are fetched (checked, cached per
node) with the S3 settings of ``storage``, the run's ``cfg.checkpoint`` (``checkpoint.s3_*``, then the
environment, as for checkpoints); without it, from the environment only.
"""

from __future__ import annotations

from dockflow.config import CheckpointConfig, DataConfig
from dockflow.data.arithmetic import generate_arithmetic
from dockflow.data.example import Example, TaskData, columns_of
from dockflow.data.loaders import Columns, DatasetError, load_examples
from dockflow.data.messages import Messages, Prompt, is_conversational
from dockflow.data.templates import (
    PromptFormat,
    TemplateError,
    apply_template,
    check_conversational,
    check_template,
)

__all__ = [
    "Columns",
    "DatasetError",
    "Example",
    "Messages",
    "Prompt",
    "PromptFormat",
    "TaskData",
    "TemplateError",
    "apply_template",
    "check_conversational",
    "check_prompts",
    "check_template",
    "columns_of",
    "is_conversational",
    "load_task",
    "task_columns",
]

# the row fields of the synthetic tasks (``Example.fields``), known without generating them
SYNTHETIC_FIELDS: dict[str, tuple[str, ...]] = {"arithmetic": (), "reasoning_gym": ("metadata",)}


def _file_task(cfg: DataConfig, storage: CheckpointConfig | None) -> TaskData:
    """Val = the first ``num_val`` rows of the train file (held out of train); labeled = the next ``num_labeled``."""
    if not cfg.train_path:
        raise DatasetError("data.source is 'file' but data.train_path is not set: give a JSONL or Parquet path")
    if not cfg.test_path:
        raise DatasetError("data.source is 'file' but data.test_path is not set: give a held-out JSONL or Parquet path")
    cols = Columns(cfg.prompt_key, cfg.answer_key)
    rows = load_examples(cfg.train_path, storage, cols)
    n_val, n_lab = cfg.arithmetic.num_val, cfg.arithmetic.num_labeled
    if n_val >= len(rows):
        raise DatasetError(
            f"{cfg.train_path} has {len(rows)} rows, not more than data.arithmetic.num_val={n_val}: "
            "lower num_val so that train rows remain"
        )
    val, train = rows[:n_val], rows[n_val:]
    test = load_examples(cfg.test_path, storage, cols)
    check_prompts(cfg, cfg.train_path, rows)
    check_prompts(cfg, cfg.test_path, test)
    return TaskData(train=train, labeled=train[:n_lab], val=val, test=test)


def check_prompts(cfg: DataConfig, where: str, examples: list[Example]) -> list[Example]:
    """``examples`` (loaded from ``where``) if ``cfg`` can render their prompts: conversational ones need
    ``data.chat_template`` and the default prompt template (``check_conversational``)."""
    if examples and is_conversational(examples[0].prompt):
        default = DataConfig.model_fields["prompt_template"].default
        check_conversational(str(where), cfg.prompt_template, cfg.chat_template, default)
    return examples


def load_task(cfg: DataConfig, seed: int, storage: CheckpointConfig | None = None) -> TaskData:
    """All splits for ``cfg`` (synthetic arithmetic, a reasoning-gym task or user files, local or ``s3://``,
    fetched with the S3 settings of ``storage``); deterministic given ``seed``."""
    check_template(cfg.prompt_template)
    if cfg.source == "arithmetic":
        return generate_arithmetic(cfg.arithmetic, seed)
    if cfg.source == "reasoning_gym":
        from dockflow.data.reasoning_gym import generate_reasoning_gym  # imports reasoning-gym only when used

        return generate_reasoning_gym(cfg.reasoning_gym, seed)
    return _file_task(cfg, storage)


def task_columns(cfg: DataConfig, seed: int, storage: CheckpointConfig | None = None) -> list[str]:
    """The keyword columns the reward functions get for ``cfg``'s train rows (``columns_of``): a synthetic task's
    are known without generating it (``SYNTHETIC_FIELDS``); a file's train rows are loaded (and checked)."""
    if cfg.source in SYNTHETIC_FIELDS:
        return [cfg.answer_key, *(k for k in SYNTHETIC_FIELDS[cfg.source] if k != cfg.answer_key)]
    return columns_of(load_task(cfg, seed, storage).train, cfg.answer_key)
