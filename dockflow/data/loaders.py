"""Load user datasets from JSONL or Parquet files whose rows have a prompt and an answer column.

The prompt column is ``data.prompt_key`` (default: ``prompt``, else ``problem`` as MATH500/AIME-style sets
name it; a row with both uses ``prompt``); it must be a non-empty string or, as in TRL's conversational datasets,
a list of ``{"role", "content"}`` messages (``dockflow.data.messages``; one file holds one format). The answer column is
``data.answer_key`` (default ``answer``): a non-empty string or a number (kept as its text, so ``42`` and
``"42"`` load alike); an answer written wholly as ``\\boxed{...}`` keeps only the box content. The other
columns (``solution``, ``tests``, ``metadata``, ...) are kept in ``Example.fields``: reward functions get them
by name. Any bad row fails the whole load with a ``DatasetError`` naming the file, the line (JSONL, 1-based)
or row (Parquet, 1-based) and the problem.

    examples = load_examples("data/train.jsonl")   # or .parquet
    load_examples("data/examples/math_mini.jsonl")  # {"problem": ..., "answer": "\\boxed{7}"} rows
    load_examples("s3://data/train.jsonl", storage=cfg.checkpoint)   # fetched (checked, cached per node)

An ``s3://bucket/key`` path is fetched with the S3 settings of ``storage`` (the run's ``cfg.checkpoint``:
``checkpoint.s3_*``, then the environment; None: the environment only) into the node's cache
(``dockflow.storage.fetch_file``); messages name the URI, not the cached copy.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dockflow.data.example import Example
from dockflow.data.messages import is_conversational, message_problem

if TYPE_CHECKING:
    from dockflow.config import CheckpointConfig

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


class DatasetError(ValueError):
    """A dataset file is missing or malformed; the message names the file and the row."""


PROMPT_KEYS = ("prompt", "problem")  # without data.prompt_key: the first one a row has is its prompt
_BOXED = re.compile(r"\\boxed\{(.*)\}", re.DOTALL)


@dataclass(frozen=True)
class Columns:
    """Which columns hold the prompt (None: 'prompt', else 'problem') and the answer."""

    prompt: str | None = None
    answer: str = "answer"

    def prompt_of(self, row: dict[str, Any]) -> str:
        if self.prompt is not None:
            return self.prompt
        return next((k for k in PROMPT_KEYS if row.get(k) is not None), PROMPT_KEYS[0])

    @property
    def need(self) -> str:
        prompt = f"'{self.prompt}'" if self.prompt else "'prompt' (or 'problem')"
        return f"every row needs {prompt} and '{self.answer}'"


def _unbox(text: str) -> str:
    """``\\boxed{X}`` -> ``X`` when the whole text is one box with balanced braces; else ``text``."""
    m = _BOXED.fullmatch(text)
    if not m:
        return text
    depth = 0
    for ch in m.group(1):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return text
    return m.group(1).strip() if depth == 0 else text


def _example(row: Any, where: str, cols: Columns) -> Example:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected an object ({cols.need}), got {type(row).__name__}")
    key, akey = cols.prompt_of(row), cols.answer
    for k in (key, akey):
        if row.get(k) is None:
            raise DatasetError(f"{where}: missing field '{k}' ({cols.need}; set data.prompt_key / data.answer_key "
                               "to name other columns)")
    prompt, answer = row[key], row[akey]
    if isinstance(prompt, list):
        problem = message_problem(prompt)
        if problem:
            raise DatasetError(f"{where}: field '{key}' {problem}")
    elif not isinstance(prompt, str):
        raise DatasetError(f"{where}: field '{key}' must be a string, got {type(prompt).__name__} "
                           "(or a list of {\"role\", \"content\"} messages)")
    elif not prompt.strip():
        raise DatasetError(f"{where}: field '{key}' is empty")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise DatasetError(f"{where}: field '{akey}' must be a string or a number, got {type(answer).__name__}")
    text = _unbox(answer.strip()) if isinstance(answer, str) else str(answer)
    if not text:
        raise DatasetError(f"{where}: field '{akey}' is empty")
    return Example(prompt=prompt, answer=text, fields={k: v for k, v in row.items() if k not in (key, akey)})


def _one_format(examples: list[Example], wheres: list[str]) -> list[Example]:
    """``examples`` if their prompts are all strings or all messages; else a DatasetError naming the first row
    that differs from the first (TRL decides a batch's format by its first prompt)."""
    first = is_conversational(examples[0].prompt) if examples else False
    for ex, where in zip(examples, wheres, strict=True):
        if is_conversational(ex.prompt) != first:
            formats = ("a string", "a list of messages")
            raise DatasetError(f"{where}: the prompt is {formats[not first]} but the first row's is {formats[first]}: "
                               "one file holds one format")
    return examples


def local_copy(path: str | Path, storage: CheckpointConfig | None = None) -> Path:
    """``path`` itself, or for ``s3://bucket/key`` its fetched local copy (``DatasetError`` with the storage
    error's one-line message when it cannot be fetched)."""
    if not str(path).startswith("s3://"):
        return Path(path)
    from dockflow.config import CheckpointConfig
    from dockflow.storage import CheckpointError, fetch_file

    try:
        return fetch_file(str(path), storage or CheckpointConfig())
    except CheckpointError as exc:
        raise DatasetError(str(exc)) from None


def load_jsonl(path: Path, name: str | None = None, cols: Columns = Columns()) -> list[Example]:
    """One JSON object per line; blank lines are skipped. ``name`` stands for the file in messages."""
    out, wheres = [], []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{name or path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            out.append(_example(row, where, cols))
            wheres.append(where)
    return _one_format(out, wheres)


def load_parquet(path: Path, name: str | None = None, cols: Columns = Columns()) -> list[Example]:
    """A Parquet table with the prompt and answer columns (and any others). ``name`` stands for the file in messages."""
    import pyarrow.parquet as pq

    label = name or str(path)
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise DatasetError(f"{label}: not a readable Parquet file ({exc})") from None
    names = table.column_names
    has_prompt = cols.prompt in names if cols.prompt else any(c in names for c in PROMPT_KEYS)
    missing = ([] if has_prompt else [cols.prompt or "prompt"]) + ([] if cols.answer in names else [cols.answer])
    if missing:
        raise DatasetError(f"{label}: missing column(s) {missing}; the table has {names}, {cols.need}")
    wheres = [f"{label}: row {i}" for i in range(1, table.num_rows + 1)]
    return _one_format([_example(row, w, cols) for row, w in zip(table.to_pylist(), wheres, strict=True)], wheres)


def load_examples(path: str | Path, storage: CheckpointConfig | None = None, cols: Columns = Columns()) -> list[Example]:
    """Load a JSONL or Parquet dataset (chosen by suffix), a local path or ``s3://bucket/key`` (fetched with the
    S3 settings of ``storage``, see the module docstring); fails loudly on a missing file or bad row."""
    name = str(path) if str(path).startswith("s3://") else str(Path(path))
    suffix = Path(name).suffix.lower()
    if suffix not in JSONL_SUFFIXES + PARQUET_SUFFIXES:
        raise DatasetError(
            f"dataset file '{name}' has suffix '{suffix}': use one of {JSONL_SUFFIXES + PARQUET_SUFFIXES}"
        )
    p = local_copy(path, storage)
    if not p.is_file():
        raise DatasetError(f"dataset file '{p}' not found: check data.train_path / data.test_path")
    examples = load_jsonl(p, name, cols) if suffix in JSONL_SUFFIXES else load_parquet(p, name, cols)
    if not examples:
        raise DatasetError(f"dataset file '{name}' has no rows")
    return examples
