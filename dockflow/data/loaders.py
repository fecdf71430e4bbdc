"""Load user datasets from JSONL or Parquet files whose rows have a 'prompt' and an 'answer'.

``prompt`` must be a non-empty string; ``answer`` a non-empty string or a number (kept as its text, so
``42`` and ``"42"`` load alike). Extra fields are ignored. Any bad row fails the whole load with a
``DatasetError`` naming the file, the line (JSONL, 1-based) or row (Parquet, 1-based) and the problem.

    examples = load_examples("data/train.jsonl")   # or .parquet
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dockflow.data.example import Example

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


class DatasetError(ValueError):
    """A dataset file is missing or malformed; the message names the file and the row."""


def _example(row: Any, where: str) -> Example:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected an object with 'prompt' and 'answer', got {type(row).__name__}")
    for key in ("prompt", "answer"):
        if row.get(key) is None:
            raise DatasetError(f"{where}: missing field '{key}' (every row needs 'prompt' and 'answer')")
    prompt, answer = row["prompt"], row["answer"]
    if not isinstance(prompt, str):
        raise DatasetError(f"{where}: field 'prompt' must be a string, got {type(prompt).__name__}")
    if not prompt.strip():
        raise DatasetError(f"{where}: field 'prompt' is empty")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise DatasetError(f"{where}: field 'answer' must be a string or a number, got {type(answer).__name__}")
    text = answer if isinstance(answer, str) else str(answer)
    if not text.strip():
        raise DatasetError(f"{where}: field 'answer' is empty")
    return Example(prompt=prompt, answer=text.strip())


def load_jsonl(path: Path) -> list[Example]:
    """One JSON object per line; blank lines are skipped."""
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            out.append(_example(row, where))
    return out


def load_parquet(path: Path) -> list[Example]:
    """A Parquet table with 'prompt' and 'answer' columns."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise DatasetError(f"{path}: not a readable Parquet file ({exc})") from None
    missing = [c for c in ("prompt", "answer") if c not in table.column_names]
    if missing:
        raise DatasetError(
            f"{path}: missing column(s) {missing}; the table has {table.column_names}, needs 'prompt' and 'answer'"
        )
    rows = table.select(["prompt", "answer"]).to_pylist()
    return [_example(row, f"{path}: row {i}") for i, row in enumerate(rows, start=1)]


def load_examples(path: str | Path) -> list[Example]:
    """Load a JSONL or Parquet dataset (chosen by suffix); fails loudly on a missing file or bad row."""
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"dataset file '{p}' not found: check data.train_path / data.test_path")
    suffix = p.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        examples = load_jsonl(p)
    elif suffix in PARQUET_SUFFIXES:
        examples = load_parquet(p)
    else:
        raise DatasetError(
            f"dataset file '{p}' has suffix '{suffix}': use one of {JSONL_SUFFIXES + PARQUET_SUFFIXES}"
        )
    if not examples:
        raise DatasetError(f"dataset file '{p}' has no rows")
    return examples
