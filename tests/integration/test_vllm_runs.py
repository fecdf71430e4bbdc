"""Whole runs with ``engine.backend=vllm engine.device=cpu`` (vLLM's CPU build) through both drivers: the CLI
(colocated actor), a disaggregated run (a generator worker takes the published weights and checks them), and the
Kubeflow pipeline under kfp.local. Each logs the rollout-vs-trainer log-prob drift every iteration and the
sync check's difference; both stay at numerical noise."""

import json
from pathlib import Path

import pytest

from dockflow.cli import main
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


def _summary(cfg) -> dict:
    return json.loads((Path(cfg.run.output_dir) / cfg.run.name / "summary.json").read_text())


def test_cli_run_colocated(tiny_overrides):
    overrides = tiny_overrides("vllm-cli", 2, **VLLM)
    assert main(["train", CONFIG, *overrides]) == 0
    cfg = load_config(CONFIG, overrides)
    _assert_engines_agree(cfg, _summary(cfg)["mlflow_run_id"], 2)


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
