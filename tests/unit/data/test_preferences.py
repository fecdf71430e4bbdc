"""Preference pairs for DPO: the JSONL loader's errors and the synthetic pairs of the arithmetic task."""

import json

import pytest

from dockflow.algos.dpo import DPOConfig
from dockflow.data import DatasetError, Example, TaskData
from dockflow.data.preferences import load_preference_pairs, preference_splits, synthetic_preferences


def write(tmp_path, rows):
    path = tmp_path / "prefs.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_loads_pairs_and_names_file_and_line_of_a_bad_row(tmp_path):
    good = {"prompt": "1+1?", "chosen": "2", "rejected": "3"}
    assert load_preference_pairs(write(tmp_path, [good]))[0].rejected == "3"
    with pytest.raises(DatasetError, match=r"prefs.jsonl:2: field 'rejected' must be a non-empty string"):
        load_preference_pairs(write(tmp_path, [good, {"prompt": "x", "chosen": "y"}]))
    with pytest.raises(DatasetError, match=r"prefs.jsonl:1: 'chosen' and 'rejected' are the same"):
        load_preference_pairs(write(tmp_path, [{"prompt": "x", "chosen": "y", "rejected": "y"}]))
    with pytest.raises(DatasetError, match=r"prefs.jsonl:1: invalid JSON"):
        load_preference_pairs(write(tmp_path, ["{oops"]))


def test_synthetic_pairs_reject_a_near_miss():
    examples = [Example(f"What is {i} + 3?", str(i + 3)) for i in range(50)]
    pairs = synthetic_preferences(examples, seed=0)
    assert [p.chosen for p in pairs] == [e.answer for e in examples]
    misses = [abs(int(p.rejected) - int(p.chosen)) for p in pairs]
    assert all(1 <= m <= 10 for m in misses)
    assert pairs == synthetic_preferences(examples, seed=0)


def test_file_pairs_hold_out_the_first_rows(tmp_path):
    rows = [{"prompt": f"p{i}", "chosen": "a", "rejected": "b"} for i in range(5)]
    cfg = DPOConfig(pairs_path=str(write(tmp_path, rows)), num_eval_pairs=2)
    task = TaskData(train=[], labeled=[], val=[], test=[])
    train, held_out = preference_splits(cfg, task, seed=0)
    assert [p.prompt for p in held_out] == ["p0", "p1"] and len(train) == 3
    with pytest.raises(DatasetError, match=r"not more than algorithm\.dpo\.num_eval_pairs=5: lower it"):
        preference_splits(DPOConfig(pairs_path=cfg.pairs_path, num_eval_pairs=5), task, seed=0)
    with pytest.raises(DatasetError, match=r"not found: check algorithm\.dpo\.pairs_path$"):
        preference_splits(DPOConfig(pairs_path=str(tmp_path / "missing.jsonl")), task, seed=0)
