"""JSONL / Parquet loaders: good files load; every malformed row names file, line/row and the problem."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dockflow.config import ArithmeticConfig, DataConfig
from dockflow.data import DatasetError, Example, load_task
from dockflow.data.loaders import load_examples


def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_loads_numbers_and_strings(tmp_path: Path) -> None:
    p = _jsonl(
        tmp_path / "d.jsonl",
        [
            json.dumps({"prompt": "What is 1 + 1?", "answer": 2}),
            "",
            json.dumps({"prompt": "Capital of France?", "answer": " Paris ", "extra": 1}),
            json.dumps({"prompt": "Half?", "answer": 0.5}),
        ],
    )
    assert load_examples(p) == [
        Example("What is 1 + 1?", "2"),
        Example("Capital of France?", "Paris", fields={"extra": 1}),  # other columns pass through
        Example("Half?", "0.5"),
    ]


GOOD = json.dumps({"prompt": "p", "answer": "1"})


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ('{"prompt": "p", "answer": ', "invalid JSON"),
        (json.dumps({"answer": "1"}), "missing field 'prompt'"),
        (json.dumps({"prompt": "p"}), "missing field 'answer'"),
        (json.dumps({"prompt": 3, "answer": "1"}), "'prompt' must be a string, got int"),
        (json.dumps({"prompt": "   ", "answer": "1"}), "'prompt' is empty"),
        (json.dumps({"prompt": "p", "answer": True}), "'answer' must be a string or a number, got bool"),
        (json.dumps({"prompt": "p", "answer": [1]}), "'answer' must be a string or a number, got list"),
        (json.dumps({"prompt": "p", "answer": ""}), "'answer' is empty"),
        (json.dumps(["p", "1"]), "expected an object"),
    ],
)
def test_malformed_jsonl_row_names_file_and_line(tmp_path: Path, bad: str, problem: str) -> None:
    p = _jsonl(tmp_path / "d.jsonl", [GOOD, GOOD, bad, GOOD])
    with pytest.raises(DatasetError) as err:
        load_examples(p)
    assert f"{p}:3:" in str(err.value)
    assert problem in str(err.value)


def test_parquet_loads_and_bad_row_names_row(tmp_path: Path) -> None:
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"prompt": ["a?", "b?"], "answer": ["1", "-2"]}), good)
    assert load_examples(good) == [Example("a?", "1"), Example("b?", "-2")]

    nums = tmp_path / "nums.parquet"
    pq.write_table(pa.table({"prompt": ["a?"], "answer": [7]}), nums)
    assert load_examples(nums) == [Example("a?", "7")]

    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"prompt": ["a?", "b?", ""], "answer": ["1", None, "3"]}), bad)
    with pytest.raises(DatasetError, match=f"{bad}: row 2: missing field 'answer'"):
        load_examples(bad)

    empty_prompt = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt": ["a?", ""], "answer": ["1", "2"]}), empty_prompt)
    with pytest.raises(DatasetError, match="row 2: field 'prompt' is empty"):
        load_examples(empty_prompt)


def test_parquet_missing_column_and_unreadable_file(tmp_path: Path) -> None:
    p = tmp_path / "cols.parquet"
    pq.write_table(pa.table({"question": ["a?"], "answer": ["1"]}), p)
    with pytest.raises(DatasetError, match=r"missing column\(s\) \['prompt'\]"):
        load_examples(p)
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    with pytest.raises(DatasetError, match="not a readable Parquet file"):
        load_examples(junk)


def test_missing_file_empty_file_and_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=f"'{tmp_path / 'nope.jsonl'}' not found"):
        load_examples(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="has no rows"):
        load_examples(tmp_path / "empty.jsonl")
    (tmp_path / "d.csv").write_text("prompt,answer\n")
    with pytest.raises(DatasetError, match="suffix '.csv'"):
        load_examples(tmp_path / "d.csv")


def test_load_task_from_files_splits_val_then_labeled(tmp_path: Path) -> None:
    rows = [json.dumps({"prompt": f"q{i}?", "answer": i}) for i in range(10)]
    train = _jsonl(tmp_path / "train.jsonl", rows)
    test = _jsonl(tmp_path / "test.jsonl", [json.dumps({"prompt": "t?", "answer": "0"})])
    arith = ArithmeticConfig(num_val=3, num_labeled=4)
    task = load_task(DataConfig(source="file", train_path=str(train), test_path=str(test), arithmetic=arith), 0)
    assert [e.prompt for e in task.val] == ["q0?", "q1?", "q2?"]
    assert [e.prompt for e in task.train] == [f"q{i}?" for i in range(3, 10)]
    assert task.labeled == task.train[:4]
    assert task.test == [Example("t?", "0")]
    with pytest.raises(DatasetError, match="data.test_path is not set"):
        load_task(DataConfig(source="file", train_path=str(train), arithmetic=arith), 0)
    with pytest.raises(DatasetError, match="num_val=10"):
        load_task(
            DataConfig(
                source="file", train_path=str(train), test_path=str(test), arithmetic=ArithmeticConfig(num_val=10)
            ),
            0,
        )


EXAMPLE_MATH = Path(__file__).resolve().parents[3] / "data" / "examples" / "math_mini.jsonl"


def test_problem_answer_rows_load_and_boxed_answers_unwrap(tmp_path: Path) -> None:
    p = _jsonl(
        tmp_path / "math500.jsonl",
        [
            json.dumps({"problem": "Compute $1+1$.", "answer": "\\boxed{2}", "solution": "...", "level": "Level 1"}),
            json.dumps({"problem": "Half of 1?", "answer": "\\boxed{\\frac{1}{2}}"}),
            json.dumps({"problem": "AIME?", "answer": 204}),
            json.dumps({"prompt": "used", "problem": "ignored", "answer": "\\boxed{1} + \\boxed{2}"}),
        ],
    )
    assert load_examples(p) == [
        Example("Compute $1+1$.", "2", fields={"solution": "...", "level": "Level 1"}),
        Example("Half of 1?", "\\frac{1}{2}"),
        Example("AIME?", "204"),
        Example("used", "\\boxed{1} + \\boxed{2}", fields={"problem": "ignored"}),  # not one box: kept as written
    ]
    assert [e.answer for e in load_examples(EXAMPLE_MATH)] == ["19", "7", "-3", "6", "-7"]


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (json.dumps({"problem": 3, "answer": "1"}), "field 'problem' must be a string, got int"),
        (json.dumps({"problem": " ", "answer": "1"}), "field 'problem' is empty"),
        (json.dumps({"problem": "p"}), "missing field 'answer'"),
        (json.dumps({"question": "p", "answer": "1"}), "missing field 'prompt' (every row needs 'prompt' (or 'problem') and 'answer'"),
        (json.dumps({"problem": "p", "answer": "\\boxed{ }"}), "field 'answer' is empty"),
    ],
)
def test_malformed_problem_rows_name_file_and_line(tmp_path: Path, bad: str, problem: str) -> None:
    p = _jsonl(tmp_path / "aime.jsonl", [json.dumps({"problem": "p", "answer": 1}), bad])
    with pytest.raises(DatasetError) as err:
        load_examples(p)
    assert str(err.value).startswith(f"{p}:2: ") and problem in str(err.value)


def test_parquet_with_problem_column(tmp_path: Path) -> None:
    p = tmp_path / "math.parquet"
    pq.write_table(pa.table({"problem": ["a?", "b?"], "answer": ["\\boxed{3}", "4"], "level": [1, 2]}), p)
    assert load_examples(p) == [Example("a?", "3", fields={"level": 1}), Example("b?", "4", fields={"level": 2})]
    no_answer = tmp_path / "no_answer.parquet"
    pq.write_table(pa.table({"problem": ["a?"]}), no_answer)
    with pytest.raises(DatasetError, match=r"missing column\(s\) \['answer'\].*'prompt' \(or 'problem'\)"):
        load_examples(no_answer)
