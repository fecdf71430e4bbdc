"""dockflow eval --data FILE --k K --mlflow-run RUN: scores a user math file and logs them to the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from dockflow.cli import main
from dockflow.config import TrackingConfig
from dockflow.models import build_tiny_model, save_pretrained_dir
from dockflow.tracking import Tracker, read_metric_history

ROOT = Path(__file__).resolve().parents[3]
CONFIG = str(ROOT / "configs" / "grpo_arith.yaml")
DATA = str(ROOT / "data" / "examples" / "math_mini.jsonl")


def test_eval_data_file_with_pass_at_k_logged_to_mlflow(
    tmp_path: Path, micro_cfg, char_tok, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the file store is fast to create
    model_dir = save_pretrained_dir(build_tiny_model(micro_cfg, char_tok, seed=0), char_tok, tmp_path / "model")
    uri = (tmp_path / "mlruns").as_uri()
    with Tracker.start(TrackingConfig(uri=uri), tmp_path, "trained", params={"train.iterations": 3}) as tr:
        pass
    overrides = [f"tracking.uri={uri}", f"run.output_dir={tmp_path}", "rollout.max_new_tokens=4", "eval.batch_size=8"]
    argv = ["eval", CONFIG, *overrides, "--model", str(model_dir), "--data", DATA, "--k", "3"]
    assert main([*argv, "--temperature", "0.7", "--mlflow-run", tr.run_id]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["data"] == DATA and out["prompts"] == 5 and out["k"] == 3 and out["temperature"] == 0.7
    assert set(out) >= {"accuracy", "pass@3", "avg@3"}
    logged = out["mlflow"]["metrics"]
    assert logged == {
        "eval/math_mini_accuracy": out["accuracy"],
        "eval/math_mini_pass_at_3": out["pass@3"],
        "eval/math_mini_avg_at_3": out["avg@3"],
    }
    assert read_metric_history(uri, tr.run_id, "eval/math_mini_pass_at_3") == [(3, out["pass@3"])]  # final step
    assert len(out["fingerprint"]) == 16
    assert MlflowClient(uri).get_run(tr.run_id).data.tags["dockflow.eval.math_mini_fingerprint"] == out["fingerprint"]

    assert main([*argv, "--limit", "2", "--mlflow-run", "0123abcd"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"dockflow eval: error: MLflow run 0123abcd does not exist in {uri}: check the run id and tracking.uri"
    ]
