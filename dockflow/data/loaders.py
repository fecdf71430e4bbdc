"""Load user datasets from JSONL or Parquet files whose rows have a 'prompt' (or 'problem') and an 'answer'.

``prompt`` must be a non-empty string; MATH500/AIME-style sets name it ``problem`` instead (a row with both
uses ``prompt``). ``answer`` is a non-empty string or a number (kept as its text, so ``42`` and ``"42"``
load alike); an answer written wholly as ``\\boxed{...}`` keeps only the box content. Extra fields
(``solution``, ``level``, ...) are ignored. Any bad row fails the whole load with a ``DatasetError`` naming
the file, the line (JSONL, 1-based) or row (Parquet, 1-based) and the problem.

    examples = load_examples("data/train.jsonl")   # or .parquet
    load_examples("data/examples/math_mini.jsonl")  # {"problem": ..., "answer": "\\boxed{7}"} rows
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from dockflow.data.example import Example

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
    """A Parquet table with 'prompt' (or 'problem') and 'answer' columns."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise DatasetError(f"{path}: not a readable Parquet file ({exc})") from None
    prompt_cols = [c for c in PROMPT_KEYS if c in table.column_names]
    missing = ([] if prompt_cols else ["prompt"]) + ([] if "answer" in table.column_names else ["answer"])
    if missing:
        raise DatasetError(
            f"{path}: missing column(s) {missing}; the table has {table.column_names}, "
            "needs 'prompt' (or 'problem') and 'answer'"
        )
    rows = table.select([*prompt_cols, "answer"]).to_pylist()
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
