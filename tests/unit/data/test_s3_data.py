"""Datasets from s3:// URIs (moto on loopback): load_task with data.source=file, DPO pairs, row errors naming the
URI, and the one-line errors of a missing object and bad credentials."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from dockflow.algos.dpo import DPOConfig
from dockflow.config import ArithmeticConfig, CheckpointConfig, DataConfig
from dockflow.data import DatasetError, Example, TaskData, load_task
from dockflow.data.loaders import load_examples
from dockflow.data.preferences import preference_splits
from dockflow.storage.s3_bucket import S3Bucket
from dockflow.storage.s3_client import S3Options


def _put(url: str, rows: list[object]) -> str:
    data = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()
    bucket, key = url.removeprefix("s3://").split("/", 1)
    S3Bucket(bucket, S3Options.from_config(CheckpointConfig())).client.put_object(
        bucket, key, io.BytesIO(data), len(data)
    )
    return url


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DOCKFLOW_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_load_task_from_s3(s3_checkpoint_dir: str, cache: Path) -> None:
    train = _put(f"{s3_checkpoint_dir}/train.jsonl", [{"prompt": f"q{i}?", "answer": i} for i in range(6)])
    test = _put(f"{s3_checkpoint_dir}/test.jsonl", [{"problem": "t?", "answer": "\\boxed{7}"}])
    cfg = DataConfig(source="file", train_path=train, test_path=test, arithmetic=ArithmeticConfig(num_val=2, num_labeled=1))
    task = load_task(cfg, 0, storage=CheckpointConfig())
    assert [e.prompt for e in task.val] == ["q0?", "q1?"] and [e.answer for e in task.train] == ["2", "3", "4", "5"]
    assert task.test == [Example("t?", "7")] and task.labeled == task.train[:1]
    assert load_task(cfg, 0) == task  # the old call form: S3 settings from the environment only
    assert sorted(p.name for p in (cache / "files").glob("*/*")) == ["test.jsonl", "train.jsonl"]


def test_s3_settings_come_from_the_checkpoint_config(s3_checkpoint_dir: str, s3_env, cache: Path, monkeypatch) -> None:
    url = _put(f"{s3_checkpoint_dir}/rows.jsonl", [{"prompt": "a?", "answer": 1}])
    monkeypatch.delenv("DOCKFLOW_S3_ENDPOINT")
    assert load_examples(url, CheckpointConfig(s3_endpoint=s3_env.endpoint)) == [Example("a?", "1")]


def test_bad_rows_and_missing_objects_name_the_uri(s3_checkpoint_dir: str, cache: Path, monkeypatch) -> None:
    bad = _put(f"{s3_checkpoint_dir}/bad.jsonl", [{"prompt": "a?", "answer": 1}, {"prompt": "b?"}])
    with pytest.raises(DatasetError, match=f"^{bad}:2: missing field 'answer'"):
        load_examples(bad)
    missing = f"{s3_checkpoint_dir}/nope.jsonl"
    with pytest.raises(DatasetError) as err:
        load_examples(missing)
    assert str(err.value).startswith(f"no object {missing} at ") and "\n" not in str(err.value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(DatasetError, match=r"rejected the credentials .*\(SignatureDoesNotMatch\)") as err:
        load_examples(bad)
    assert "\n" not in str(err.value) and "wrong-secret" not in str(err.value)


def test_dpo_pairs_from_s3(s3_checkpoint_dir: str, cache: Path) -> None:
    rows = [{"prompt": f"{i}+1?", "chosen": str(i + 1), "rejected": str(i + 2)} for i in range(4)]
    cfg = DPOConfig(pairs_path=_put(f"{s3_checkpoint_dir}/prefs.jsonl", rows), num_eval_pairs=1)
    train, held_out = preference_splits(cfg, TaskData([], [], [], []), seed=0, storage=CheckpointConfig())
    assert [p.chosen for p in held_out] == ["1"] and [p.chosen for p in train] == ["2", "3", "4"]
