"""End to end on a local Ray cluster: SFT warm start, RL iterations through the dock, MLflow, resume."""

from pathlib import Path

import pytest
from safetensors.torch import load_file

from dockflow.config import load_config
from dockflow.flow.trainer import train
from dockflow.tracking import read_metric_history, resolve_tracking_uri

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sft_cache(tmp_path_factory) -> Path:
    """One SFT warm start shared by the module's runs (same SFT inputs -> a cache hit after the first)."""
    return tmp_path_factory.mktemp("sft_cache")


def small_config(tmp: Path, cache: Path, name: str, iterations: int):
    # SFT memorises a handful of 1-digit sums, so sampled responses are right often but not always:
    # groups then disagree and GRPO has a signal to follow.
    overrides = {
        "run.name": name,
        "run.output_dir": str(tmp / "runs"),
        "data.arithmetic.digits": 1,
        "data.arithmetic.ops": "[+]",
        "data.arithmetic.num_train": 60,
        "data.arithmetic.num_labeled": 60,
        "data.arithmetic.num_val": 20,
        "data.arithmetic.num_test": 20,
        "sft.lr": 3e-3,
        "sft.max_epochs": 30,
        "sft.eval_every_epochs": 10,
        "sft.patience": 3,
        "sft.cache_dir": str(cache),
        "rollout.prompts_per_iter": 4,
        "rollout.group_size": 4,
        "rollout.batch_size": 8,
        "rollout.temperature": 1.5,
        "train.iterations": iterations,
        "train.mini_batch_size": 8,
        "train.micro_batch_size": 4,
        "train.infer_batch_size": 8,
        "train.epochs": 2,
        "train.lr": 1e-3,
        "algorithm.kl_coef": 0.05,
        "ray.actor_cpus": 1,
        "ray.reference_cpus": 1,
        "ray.torch_threads": 1,
        "eval.every": 2,
        "eval.num_prompts": 20,
        "checkpoint.every": 2,
    }
    return load_config("configs/grpo_arith.yaml", [f"{k}={v}" for k, v in overrides.items()])


def weights(model_dir: str | Path) -> dict:
    return load_file(str(Path(model_dir) / "model.safetensors"))


def test_two_iterations_change_policy_and_reach_mlflow(tmp_path, sft_cache):
    cfg = small_config(tmp_path, sft_cache, "two", iterations=2)
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


def test_resume_is_bit_identical(tmp_path, sft_cache):
    full = train(small_config(tmp_path, sft_cache, "full", iterations=4))
    train(small_config(tmp_path, sft_cache, "split", iterations=2))
    resumed = train(small_config(tmp_path, sft_cache, "split", iterations=4), resume=True)
    assert resumed["iterations"] == 4
    a, b = weights(full["final_model"]), weights(resumed["final_model"])
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] == b[k]).all(), f"{k} differs after resume"
    assert full["reward_per_iteration"] == resumed["reward_per_iteration"]
