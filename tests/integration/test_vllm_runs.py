"""Whole runs with ``engine.backend=vllm engine.device=cpu`` (vLLM's CPU build) through both drivers: the Kubeflow
pipeline under kfp.local (colocated actor), ``train`` disaggregated (a generator worker takes the published weights
and checks them), and the CLI, whose strict sync check stops the run with one line. The runs log the
rollout-vs-trainer log-prob drift every iteration and the sync check's difference; both stay at numerical noise."""

import subprocess
import sys

import pytest

from dockflow.config import load_config
from dockflow.flow.trainer import train
from dockflow.tracking import read_metric_history, resolve_tracking_uri
from pipelines.launch import run_local

pytestmark = pytest.mark.slow
CONFIG = "configs/grpo_arith.yaml"
VLLM = {"engine__backend": "vllm", "engine__device": "cpu", "engine__vllm__kv_cache_memory_gb": 0.25,
        "engine__vllm__enforce_eager": "true"}
DRIFT = ("rollout/logprob_abs_diff_mean", "rollout/logprob_abs_diff_max", "rollout/token_mult_prob_error")


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


def test_a_sync_that_fails_its_check_stops_the_cli_with_one_line(tiny_overrides):
    """The stop path of the sync check end to end: a tolerance below the engines' numerical noise (vLLM's fp32
    kernels differ from torch's by ~1e-5) fails the first sync in the actor, and the CLI exits 2 with one line."""
    overrides = tiny_overrides("vllm-strict", 2, engine__sync_check__tolerance=1e-12, **VLLM)
    done = subprocess.run([sys.executable, "-m", "dockflow.cli", "train", CONFIG, *overrides], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("dockflow train: error: ") and "Traceback" not in done.stderr
    assert "weight sync 1 did not take: VLLMGenerationEngine's log-probs of 4 probe sequences" in last, last


def test_pipeline_run_under_kfp_local(tiny_overrides):
    overrides = tiny_overrides("vllm-kfp", 2, **VLLM)
    cfg = load_config(CONFIG, overrides)
    out = run_local(CONFIG, overrides, cfg)
    assert out["iterations"] == 2
    _assert_engines_agree(cfg, out["mlflow_run_id"], 2)


def test_disaggregated_generator_checks_the_published_weights(tiny_config):
    cfg = tiny_config("vllm-gen", 3, placement__mode="disaggregated", placement__generator_cpus=0,
                      train__max_staleness=1, **VLLM)
    out = train(cfg)
    assert out["iterations"] == 3
    checks = _history(cfg, out["mlflow_run_id"], "reshard/sync_check_max_diff")
    assert checks and all(v < 1e-3 for v in checks.values()), checks
    drift = _history(cfg, out["mlflow_run_id"], "rollout/logprob_abs_diff_max")
    assert drift and all(v < 1e-3 for v in drift.values()), drift  # on-policy samples only
