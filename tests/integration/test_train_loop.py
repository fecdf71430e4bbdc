"""End to end on a local Ray cluster: SFT warm start, RL iterations through the dock, MLflow, resume."""

from pathlib import Path

import pytest
from safetensors.torch import load_file

from dockflow.flow.trainer import train
from dockflow.tracking import read_metric_history, resolve_tracking_uri

pytestmark = pytest.mark.slow


def weights(model_dir: str | Path) -> dict:
    return load_file(str(Path(model_dir) / "model.safetensors"))


def test_two_iterations_change_policy_and_reach_mlflow(tiny_config):
    cfg = tiny_config("two", 2, algorithm__kl_coef=0.05)
    summary = train(cfg)
    assert summary["iterations"] == 2
    assert {"accuracy_before", "accuracy_after", "throughput_tps", "wall_seconds", "mlflow_run_id"} <= summary.keys()
    assert summary["throughput_tps"] > 0
    assert 0 < sum(summary["reward_per_iteration"]) < 2, "rewards must vary for GRPO to have a signal"
    run_dir = Path(summary["final_model"]).parent
    assert (run_dir / "summary.json").is_file()
    before, after = weights(summary["initial_model"]), weights(summary["final_model"])
    changed = [k for k in before if not (before[k] == after[k]).all()]
    assert len(changed) == len(before), f"unchanged tensors: {set(before) - set(changed)}"
    uri = resolve_tracking_uri(None, run_dir)
    for key in ("reward/mean", "train/pg_loss", "train/kl", "timing/generate_s", "perf/throughput_tps"):
        assert [s for s, _ in read_metric_history(uri, summary["mlflow_run_id"], key)] == [1, 2], key
    assert len(read_metric_history(uri, summary["mlflow_run_id"], "eval/test_accuracy")) == 2


def test_resume_through_s3_is_bit_identical(tiny_config, s3_checkpoint_dir):
    """Checkpoints go to a real S3-protocol server (moto on 127.0.0.1), as they would to MinIO."""

    def cfg(name: str, iterations: int):
        return tiny_config(name, iterations, algorithm__kl_coef=0.05, checkpoint__dir=f"{s3_checkpoint_dir}/{name}")

    full = train(cfg("full", 4))
    train(cfg("split", 2))
    resumed = train(cfg("split", 4), resume=True)
    assert resumed["iterations"] == 4
    a, b = weights(full["final_model"]), weights(resumed["final_model"])
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] == b[k]).all(), f"{k} differs after resume"
    assert full["reward_per_iteration"] == resumed["reward_per_iteration"]
