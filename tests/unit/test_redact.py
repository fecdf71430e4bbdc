"""Credentials never printed: a ``tracking.uri`` (and any URI value) with a password, and keys named like secrets,
are hidden in MLflow params and tags (on a real local store: ``tests/unit/tracking/test_mlflow_tracker.py``), error lines (MLflow's, the CLI's), the pipeline's Markdown
report, ``config.yaml``, ``summary.json`` and the checkpoint's config part."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException

from dockflow import cli
from dockflow.config import load_config
from dockflow.flow.pipeline_tasks import mlflow_link
from dockflow.flow.run_checkpoint import commit_checkpoint
from dockflow.flow.run_record import RunRecord
from dockflow.flow.run_setup import write_run_config
from dockflow.redact import redact_config, redact_text
from dockflow.storage import LocalCheckpointStore
from dockflow.tracking.store import TrackingError, explain

SECRET = "s3cr3t-PW"
URI = f"https://ann:{SECRET}@mlflow.example:5000"


@pytest.mark.parametrize(("text", "shown"), [
    (f"MLflow at {URI} failed", "MLflow at https://ann:***@mlflow.example:5000 failed"),
    (f"postgresql://u:{SECRET}@db/x and s3://bucket/p", "postgresql://u:***@db/x and s3://bucket/p"),
    (f"https://ann:p@{SECRET}@h/x", "https://ann:***@h/x"),  # an unencoded @ in the password
    (f"https://{SECRET}@github.com/o/r", "https://***@github.com/o/r"),  # a token as the user
    (f"http://h/x?token={SECRET}&a=1&X-Amz-Signature={SECRET}", "http://h/x?token=***&a=1&X-Amz-Signature=***"),
    ("sqlite:////tmp/mlflow.db, ann@example.com, a=b", "sqlite:////tmp/mlflow.db, ann@example.com, a=b"),
])
def test_uris_lose_their_credentials(text: str, shown: str) -> None:
    assert redact_text(text) == shown


def test_keys_named_like_secrets_are_hidden_and_others_kept() -> None:
    cfg = {"hf_token": SECRET, "s3": {"secret_key": SECRET, "endpoint": URI}, "max_total_tokens": 7,
           "token_budget": 4, "paths": [URI], "password": None}
    assert redact_config(cfg) == {"hf_token": "***", "s3": {"secret_key": "***", "endpoint": redact_text(URI)},
                                  "max_total_tokens": 7, "token_budget": 4, "paths": [redact_text(URI)],
                                  "password": None}


def test_error_lines_and_the_report_show_no_password(capsys: pytest.CaptureFixture, monkeypatch) -> None:
    err = explain(URI, MlflowException(f"API request to {URI}/api/2.0/mlflow/runs/create failed"))
    assert SECRET not in str(err) and "https://ann:***@mlflow.example:5000" in str(err)
    assert SECRET not in str(TrackingError(f"cannot use {URI}"))
    assert SECRET not in mlflow_link(URI, "1", "abc") and "[MLflow run abc](https://ann:***@" in mlflow_link(URI, "1", "abc")

    class DownError(RuntimeError):
        __module__ = "dockflow.tracking.store"

    def failing_ours(args: object) -> int:
        raise DownError(f"tracking server {URI} is down")

    monkeypatch.setattr(cli, "_cmd_train", failing_ours)
    assert cli.main(["train", "x.yaml"]) == 2
    line = capsys.readouterr().err
    assert SECRET not in line and "https://ann:***@mlflow.example:5000 is down" in line


def test_the_run_files_and_the_checkpoint_config_show_no_password(tmp_path: Path) -> None:
    cfg = load_config(None, [f"tracking.uri={URI}"])
    write_run_config(cfg, tmp_path)
    assert SECRET not in (tmp_path / "config.yaml").read_text()
    store = LocalCheckpointStore(tmp_path / "ckpt", keep=1)
    commit_checkpoint(store, 1, RunRecord(iteration=1), cfg)
    assert store.read_part(1, "config")["tracking"]["uri"] == "https://ann:***@mlflow.example:5000"
    assert cfg.tracking.uri == URI  # the run itself keeps the real value
