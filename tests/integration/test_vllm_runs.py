"""Whole runs with ``engine.backend=vllm engine.device=cpu`` (vLLM's CPU build): ``train`` with a colocated actor
and ``train`` disaggregated with LoRA (a generator worker takes the published adapters and checks them), on one local Ray
cluster, and ``dockflow train`` (in the test process), whose strict sync check stops the run with one line. The
runs log the rollout-vs-trainer log-prob drift every iteration and the sync check's difference; both stay at
numerical noise. The Kubeflow pipeline starts its workers through the same ``RunSession`` as ``train`` (nothing
in ``pipelines/``, ``components/`` or ``dockflow/flow/`` reads ``engine.backend``): ``test_pipeline_local.py`` runs
it on the HF engine."""

import pytest

from dockflow.cli import main
from dockflow.flow.trainer import train
from dockflow.tracking import read_metric_history, resolve_tracking_uri

pytestmark = pytest.mark.slow
CONFIG = "configs/grpo_arith.yaml"
VLLM = {"engine__backend": "vllm", "engine__device": "cpu", "engine__vllm__kv_cache_memory_gb": 0.25,
        "engine__vllm__enforce_eager": "true"}
# The colocated runs take the centralized dock (one actor, not a controller per worker state): they are about the
# engine, and the distributed dock carries the colocated GRPO run of test_train_loop.py. The disaggregated run
# keeps it: with max_staleness 1 it is the one run of the suite with the snapshot consumer on the distributed dock.
CENTRALIZED = {"dock__backend": "centralized"}
DRIFT = ("rollout/logprob_abs_diff_mean", "rollout/logprob_abs_diff_max", "rollout/token_mult_prob_error")


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster for the two ``train`` runs (``train`` joins it instead of starting its own)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="test-vllm-runs")
    yield
    ray.shutdown()


def _history(cfg, run_id: str, key: str) -> dict[int, float]:
    return dict(read_metric_history(resolve_tracking_uri(cfg.tracking.uri, cfg.run.output_dir), run_id, key))


def _assert_engines_agree(cfg, run_id: str, iterations: int) -> None:
    for key in DRIFT:
        values = _history(cfg, run_id, key)
        assert sorted(values) == list(range(1, iterations + 1)), key
        assert all(v < 1e-3 for v in values.values()) if key != DRIFT[2] else all(
            abs(v - 1) < 1e-3 for v in values.values()), (key, values)
    checks = _history(cfg, run_id, "reshard/sync_check_max_diff")
    assert checks and all(v < 1e-3 for v in checks.values()), checks


def test_a_sync_that_fails_its_check_stops_the_cli_with_one_line(tiny_overrides, capsys, caplog):
    """The stop path of the sync check end to end: a tolerance below the engines' numerical noise (vLLM's fp32
    kernels differ from torch's by ~1e-5) fails the first sync in the actor, and ``dockflow train`` returns 2 with
    one line (``dockflow.cli.main`` in this process, on a local Ray cluster of its own, as the command runs)."""
    import ray

    assert not ray.is_initialized()
    overrides = tiny_overrides("vllm-strict", 2, engine__sync_check__tolerance=1e-12, **VLLM, **CENTRALIZED)
    assert main(["train", CONFIG, *overrides]) == 2
    assert not ray.is_initialized()  # the run stopped the cluster it started
    err = capsys.readouterr().err  # the CLI's own stderr and the workers' logs, as a terminal would show them
    last = err.strip().splitlines()[-1]
    assert last.startswith("dockflow train: error: ") and "Traceback" not in err, err[-3000:]
    assert "Traceback" not in caplog.text  # what the CLI's logging would print to stderr (pytest captures it)
    assert "weight sync 1 did not take: VLLMGenerationEngine's log-probs of 4 probe sequences" in last, last


def _assert_corrected(cfg, run_id: str, share: str) -> None:
    """The rollout correction's metrics were logged every iteration; with the engines in agreement each ratio is 1
    and nothing is masked or truncated."""
    for key in ("train/rollout_is_ratio_mean", "train/rollout_is_ratio_max"):
        values = _history(cfg, run_id, key)
        assert values and all(abs(v - 1) < 1e-2 for v in values.values()), (key, values)
    shares = _history(cfg, run_id, share)
    assert shares and all(v == 0 for v in shares.values()), shares


def test_colocated_actor_syncs_vllm_every_iteration(ray_cluster, tiny_config):
    """With the sequence-level mask of rollout correction (TRL's sequence_mask) over vLLM's log-probs."""
    cfg = tiny_config("vllm-colocated", 2, **VLLM, **CENTRALIZED, train__rollout_correction__mode="sequence_mask")
    out = train(cfg)
    assert out["iterations"] == 2
    _assert_engines_agree(cfg, out["mlflow_run_id"], 2)
    _assert_corrected(cfg, out["mlflow_run_id"], "train/rollout_is_masked_share")


def test_disaggregated_generator_checks_the_published_weights(ray_cluster, tiny_config):
    """With ``model.lora``: the actor publishes the adapters alone (the bytes of the final adapter in PEFT's
    format, every version), the generator's vLLM loads each as a new adapter on its own base, and the sync check
    and the drift prove the new adapter is what generates (verl #7495: an adapter that never reaches the engine
    looks like staleness). About 30-40 s: vLLM's CPU engine starts in the generator worker, beside the actor."""
    from safetensors.torch import load_file

    cfg = tiny_config("vllm-gen", 3, placement__mode="disaggregated", placement__generator_cpus=0,
                      train__max_staleness=1, train__rollout_correction__mode="token_truncate",
                      model__lora="{rank: 4, alpha: 8.0}", **VLLM)
    out = train(cfg)
    assert out["iterations"] == 3
    checks = _history(cfg, out["mlflow_run_id"], "reshard/sync_check_max_diff")
    assert checks and all(v < 1e-3 for v in checks.values()), checks
    drift = _history(cfg, out["mlflow_run_id"], "rollout/logprob_abs_diff_max")
    assert drift and all(v < 1e-3 for v in drift.values()), drift  # on-policy samples only
    adapter = load_file(f"{out['final_model']}/adapter/adapter_model.safetensors")
    published = _history(cfg, out["mlflow_run_id"], "reshard/publish_bytes")
    assert published and set(published.values()) == {sum(t.nbytes for t in adapter.values())}, published
    _assert_corrected(cfg, out["mlflow_run_id"], "train/rollout_is_truncated_share")
