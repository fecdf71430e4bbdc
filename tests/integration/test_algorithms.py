"""Every algorithm's example config, shrunk to the tiny task, runs 2 iterations end to end and trains.
DAPO (dynamic sampling) runs end to end as the KFP pipeline's algorithm in ``test_pipeline_local.py``.

One local Ray cluster serves the whole module (``train`` joins it instead of starting its own).
"""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dockflow.flow.trainer import train
from dockflow.tracking import read_metric_history, resolve_tracking_uri

pytestmark = pytest.mark.slow

# config -> metrics that only this algorithm logs (each must reach MLflow for both iterations)
ALGORITHMS = {
    "ppo": ("critic/value_loss", "train/pg_loss"),
    "pf_ppo": ("critic/value_loss", "train/pg_loss"),
    "reinforce_pp": ("train/pg_loss",),  # its -baseline variant differs only in the advantage (unit-tested)
    "dpo": ("train/dpo_margin", "train/dpo_reward_accuracy"),
}


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="test-algorithms")
    yield
    ray.shutdown()


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_two_iterations_train_the_policy(algorithm, ray_cluster, tiny_config):
    # The centralized dock is one actor instead of a controller per worker state: these tests are about the
    # algorithms (the distributed dock has its own tests and carries the GRPO run of test_train_loop).
    extra = {"dock__backend": "centralized"}
    if algorithm == "dpo":
        extra |= {"rollout__group_size": 2, "algorithm__dpo__num_eval_pairs": 10}
    if algorithm == "pf_ppo":
        extra["algorithm__pf_ppo__keep"] = 2  # G x keep = 8 = one mini-batch
    if algorithm == "reinforce_pp":  # also the asynchronous scheduler: a generator worker runs one version ahead
        extra |= {"placement__mode": "disaggregated", "train__max_staleness": 1, "placement__generator_cpus": 0}
    cfg = tiny_config(algorithm, 2, config=f"configs/{algorithm}_arith.yaml", **extra)
    summary = train(cfg)

    assert summary["iterations"] == 2 and summary["algorithm"] == algorithm
    before = load_file(str(Path(summary["initial_model"]) / "model.safetensors"))
    after = load_file(str(Path(summary["final_model"]) / "model.safetensors"))
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert not unchanged, f"{algorithm} left parameters unchanged: {unchanged}"
    uri = resolve_tracking_uri(None, Path(summary["final_model"]).parent)
    for key in ALGORITHMS[algorithm] + ("perf/throughput_tps", "timing/update_s"):
        history = read_metric_history(uri, summary["mlflow_run_id"], key)
        assert [s for s, _ in history] == [1, 2], key
        assert all(v == v for _, v in history), f"{key} is NaN"
    if algorithm == "reinforce_pp":
        ages = read_metric_history(uri, summary["mlflow_run_id"], "staleness/max")
        assert [v for _, v in ages] == [0.0, 1.0]  # iteration 2 was generated before update 1 finished
        assert read_metric_history(uri, summary["mlflow_run_id"], "flow/idle_generator")
    if algorithm == "dpo":
        assert summary["margin_before"] is not None and summary["margin_after"] is not None
