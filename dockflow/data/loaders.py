"""Load user datasets from JSONL or Parquet files whose rows have a 'prompt' (or 'problem') and an 'answer'.

``prompt`` must be a non-empty string; MATH500/AIME-style sets name it ``problem`` instead (a row with both
uses ``prompt``). ``answer`` is a non-empty string or a number (kept as its text, so ``42`` and ``"42"``
load alike); an answer written wholly as ``\\boxed{...}`` keeps only the box content. Extra fields
(``solution``, ``level``, ...) are ignored. Any bad row fails the whole load with a ``DatasetError`` naming
the file, the line (JSONL, 1-based) or row (Parquet, 1-based) and the problem.

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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dockflow.data.example import Example

if TYPE_CHECKING:
    from dockflow.config import CheckpointConfig

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


class DatasetError(ValueError):
    """A dataset file is missing or malformed; the message names the file and the row."""


PROMPT_KEYS = ("prompt", "problem")  # the first one a row has is its prompt
_BOXED = re.compile(r"\\boxed\{(.*)\}", re.DOTALL)


def _prompt_key(row: dict[str, Any]) -> str:
    return next((k for k in PROMPT_KEYS if row.get(k) is not None), PROMPT_KEYS[0])


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


def _example(row: Any, where: str) -> Example:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected an object with 'prompt' and 'answer', got {type(row).__name__}")
    key = _prompt_key(row)
    if row.get(key) is None:
        raise DatasetError(f"{where}: missing field 'prompt' (every row needs 'prompt' or 'problem', and 'answer')")
    if row.get("answer") is None:
        raise DatasetError(f"{where}: missing field 'answer' (every row needs 'prompt' or 'problem', and 'answer')")
    prompt, answer = row[key], row["answer"]
    if not isinstance(prompt, str):
        raise DatasetError(f"{where}: field '{key}' must be a string, got {type(prompt).__name__}")
    if not prompt.strip():
        raise DatasetError(f"{where}: field '{key}' is empty")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise DatasetError(f"{where}: field 'answer' must be a string or a number, got {type(answer).__name__}")
    text = _unbox(answer.strip()) if isinstance(answer, str) else str(answer)
    if not text:
        raise DatasetError(f"{where}: field 'answer' is empty")
    return Example(prompt=prompt, answer=text)


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


def load_jsonl(path: Path, name: str | None = None) -> list[Example]:
    """One JSON object per line; blank lines are skipped. ``name`` stands for the file in messages."""
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{name or path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            out.append(_example(row, where))
    return out


def load_parquet(path: Path, name: str | None = None) -> list[Example]:
    """A Parquet table with 'prompt' (or 'problem') and 'answer' columns. ``name`` stands for the file in messages."""
    import pyarrow.parquet as pq

    label = name or str(path)
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise DatasetError(f"{label}: not a readable Parquet file ({exc})") from None
    prompt_cols = [c for c in PROMPT_KEYS if c in table.column_names]
    missing = ([] if prompt_cols else ["prompt"]) + ([] if "answer" in table.column_names else ["answer"])
    if missing:
        raise DatasetError(
            f"{label}: missing column(s) {missing}; the table has {table.column_names}, "
            "needs 'prompt' (or 'problem') and 'answer'"
        )
    rows = table.select([*prompt_cols, "answer"]).to_pylist()
    return [_example(row, f"{label}: row {i}") for i, row in enumerate(rows, start=1)]


def load_examples(path: str | Path, storage: CheckpointConfig | None = None) -> list[Example]:
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
    examples = load_jsonl(p, name) if suffix in JSONL_SUFFIXES else load_parquet(p, name)
    if not examples:
        raise DatasetError(f"dataset file '{name}' has no rows")
    return examples
