"""End to end on a local Ray cluster: SFT warm start, RL iterations through the dock, MLflow, resume."""

from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from dockflow.algos.base import Algorithm
from dockflow.flow.single_process import run_single_process
from dockflow.flow.trainer import train
from dockflow.storage import run_store
from dockflow.storage.objects import fetch_model
from dockflow.tracking import read_metric_history, resolve_tracking_uri

pytestmark = pytest.mark.slow


def _flat(state) -> list:
    """An optimizer state as comparable (path, value) pairs: tensors become lists."""
    if isinstance(state, dict):
        return [(k, _flat(v)) for k, v in sorted(state.items(), key=lambda kv: str(kv[0]))]
    if isinstance(state, (list, tuple)):
        return [_flat(v) for v in state]
    return state.tolist() if isinstance(state, torch.Tensor) else state


def weights(model_uri: str, cfg) -> dict:
    """The model's tensors, fetched from the checkpoint store (here S3) like a worker does."""
    return load_file(str(fetch_model(model_uri, cfg.checkpoint) / "model.safetensors"))


@pytest.fixture
def ray_cluster(s3_env):
    """One local Ray cluster for the test's three runs (``train`` joins it instead of starting its own), started
    with the S3 keys in its environment (the workers read them)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="test-train-loop")
    yield
    ray.shutdown()


def test_train_learns_logs_and_resumes_bit_identically_through_s3(ray_cluster, tiny_config, s3_checkpoint_dir,
                                                                  monkeypatch):
    """A 4-iteration run changes every policy tensor and logs each iteration to MLflow. A run of its first 2
    iterations with a generator worker (disaggregated, max_staleness 0) checkpoints the same policy and
    optimizer state bit for bit, and resumed from that checkpoint (colocated) ends bit-identical to the
    4-iteration run. Checkpoints go to a real S3-protocol server (moto on 127.0.0.1), as they would to MinIO.
    (One test, one Ray cluster: each cluster costs start-up.)"""

    def cfg(name: str, iterations: int, **extra):
        # No KL term: the reference worker (frozen, not checkpointed) would only add start-up time here; the
        # KL algorithms (REINFORCE++, PPO, DPO) run it in test_algorithms.
        # checkpoints under a root (<dir>/<run.name>); MLflow in the default store, in the run directory
        return tiny_config(name, iterations, checkpoint__dir=s3_checkpoint_dir, tracking__uri="null", **extra)

    full_cfg = cfg("full", 4)
    builds = []  # the run plan, built once by the driver and passed on (workers get it, they do not rebuild it)
    build = Algorithm.plan
    with monkeypatch.context() as patch:
        patch.setattr(Algorithm, "plan", lambda self, c: builds.append(c.run.name) or build(self, c))
        full = train(full_cfg)
    assert builds == ["full"], f"the run plan was built {len(builds)} times in the driver"
    assert full["iterations"] == 4
    assert {"accuracy_before", "accuracy_after", "throughput_tps", "wall_seconds", "mlflow_run_id"} <= full.keys()
    assert full["throughput_tps"] > 0
    assert 0 < sum(full["reward_per_iteration"]) < 4, "rewards must vary for GRPO to have a signal"
    run_dir = Path(full_cfg.run.output_dir) / "full"
    assert (run_dir / "summary.json").is_file()
    assert full["final_model"] == f"{s3_checkpoint_dir}/full/final_model"
    before, after = weights(full["initial_model"], full_cfg), weights(full["final_model"], full_cfg)
    # the single-process loop (the map a newcomer reads first) computes what the run did, bit for bit
    alone = run_single_process(full_cfg, full["initial_model"])
    assert alone["reward_per_iteration"] == full["reward_per_iteration"]
    assert all(torch.equal(alone["weights"][k], after[k]) for k in after), "the single-process loop differs"
    changed = [k for k in before if not (before[k] == after[k]).all()]
    assert len(changed) == len(before), f"unchanged tensors: {set(before) - set(changed)}"
    uri = resolve_tracking_uri(None, full_cfg.run.output_dir)
    for key in ("reward/mean", "train/pg_loss", "train/kl", "timing/generate_s", "perf/throughput_tps"):
        assert [s for s, _ in read_metric_history(uri, full["mlflow_run_id"], key)] == [1, 2, 3, 4], key
    assert [s for s, _ in read_metric_history(uri, full["mlflow_run_id"], "eval/test_accuracy")] == [0, 2, 4]
    # the HF engine samples with the trainer's own tensors: its log-probs equal the trainer's up to kernel noise
    drift = read_metric_history(uri, full["mlflow_run_id"], "rollout/logprob_abs_diff_max")
    assert [s for s, _ in drift] == [1, 2, 3, 4] and all(v < 1e-4 for _, v in drift), drift
    # colocated, the HF engine samples with the policy's own module: no sync to check (the split run's generator
    # loads published weights into its own model and checks them, below)
    assert not read_metric_history(uri, full["mlflow_run_id"], "reshard/sync_check_max_diff")

    split = cfg("split", 2, placement__mode="disaggregated", placement__generator_cpus=0)
    first_half = train(split)
    assert first_half["reward_per_iteration"] == full["reward_per_iteration"][:2]
    checks = read_metric_history(resolve_tracking_uri(None, split.run.output_dir), first_half["mlflow_run_id"],
                                 "reshard/sync_check_max_diff")
    assert checks and all(v < 1e-4 for _, v in checks), checks
    on_policy = run_store(split.checkpoint, split.run).read_part(2, "actor")["engine"]
    reference = run_store(full_cfg.checkpoint, full_cfg.run).read_part(2, "actor")["engine"]
    for k, v in reference["model"].items():
        assert torch.equal(v, on_policy["model"][k]), f"{k}: max_staleness 0 with a generator worker differs from sync"
    assert _flat(reference["optimizer"]) == _flat(on_policy["optimizer"])
    resumed = train(cfg("split", 4), resume=True)
    assert resumed["iterations"] == 4
    a, b = weights(full["final_model"], full_cfg), weights(resumed["final_model"], split)
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] == b[k]).all(), f"{k} differs after resume"
    assert full["reward_per_iteration"] == resumed["reward_per_iteration"]
    # the CLI driver tags its run with its evaluation's identity; the same config is the same evaluation
    assert resumed["evaluation"] == full["evaluation"] and full["evaluation"]["num_prompts"] == str(full_cfg.eval.num_prompts)
    tags = MlflowClient(uri).get_run(full["mlflow_run_id"]).data.tags
    assert tags["dockflow.eval.fingerprint"] == full["evaluation"]["fingerprint"]
    assert tags["dockflow.lineage.base_model"] == full["lineage"]["base_model"] and tags["dockflow.lineage.task"]
