"""Shared set-up of the end-to-end runs: a tiny config on 1-digit sums, one SFT cache and one MLflow store per
session."""

from collections.abc import Callable
from pathlib import Path

import pytest

from dockflow.config import Config, load_config

# SFT memorises a handful of 1-digit sums, so sampled responses are right often but not always:
# groups then disagree and the policy-gradient algorithms have a signal to follow.
TINY_RUN = {
    "data.arithmetic.digits": 1,
    "data.arithmetic.ops": "[+]",
    "data.arithmetic.num_train": 60,
    "data.arithmetic.num_labeled": 60,
    "data.arithmetic.num_val": 20,
    "data.arithmetic.num_test": 20,
    "sft.lr": 3e-3,
    "sft.weight_decay": 0.0,  # memorising is the point here (the demo's decay is against memorising its 900 rows)
    "sft.ema_decay": 0.0,  # 30 steps in all: the weights themselves
    "sft.target_val_accuracy": "null",
    "sft.max_epochs": 30,
    "sft.eval_every_epochs": 10,
    "sft.patience": 3,
    "sft.min_val_accuracy": "null",  # the demo's floor is for its 2-digit task, not this tiny one
    "rollout.prompts_per_iter": 4,
    "rollout.group_size": 4,
    "rollout.batch_size": 8,
    "rollout.temperature": 1.5,
    "train.mini_batch_size": 8,
    "train.micro_batch_size": 4,
    "train.infer_batch_size": 8,
    "train.epochs": 2,
    "train.lr": 1e-3,
    "ray.actor_cpus": 1,
    "ray.reference_cpus": 1,
    "ray.critic_cpus": 0,
    "ray.torch_threads": 1,
    "eval.every": 2,
    "eval.num_prompts": 20,
    "checkpoint.every": 2,
    "registry.model_name": "null",  # the registry has its own tests and the recurring pipeline runs
}


@pytest.fixture(scope="session")
def sft_cache(tmp_path_factory) -> Path:
    """One SFT warm start shared by every run (same SFT inputs -> a cache hit after the first)."""
    return tmp_path_factory.mktemp("sft_cache")


@pytest.fixture(scope="session")
def tracking_store(tmp_path_factory) -> str:
    """One local MLflow store (SQLite) for every run that names no other: creating a store's tables costs about a
    second per test. (``test_train_loop.py`` keeps the default, a store in the run directory.)"""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def tiny_overrides(tmp_path: Path, sft_cache: Path, tracking_store: str) -> Callable[..., list[str]]:
    """Factory: ``tiny_overrides(name, iterations, section__key=value)`` is the list of dotted overrides that
    shrink a config to the tiny task (dots written as '__' in the keywords); runs go under the test's tmp_path,
    their MLflow runs to the session's ``tracking_store``."""

    def make(name: str, iterations: int, **extra) -> list[str]:
        overrides = {
            **TINY_RUN,
            "run.name": name,
            "run.output_dir": str(tmp_path / "runs"),
            "sft.cache_dir": str(sft_cache),
            "tracking.uri": tracking_store,
            "train.iterations": iterations,
            **{k.replace("__", "."): v for k, v in extra.items()},
        }
        return [f"{k}={v}" for k, v in overrides.items()]

    return make


@pytest.fixture
def tiny_config(tiny_overrides: Callable[..., list[str]]) -> Callable[..., Config]:
    """Factory: ``tiny_config(name, iterations, config=..., section__key=value)`` is ``config`` shrunk to the
    tiny task (see ``tiny_overrides``)."""

    def make(name: str, iterations: int, config: str = "configs/grpo_arith.yaml", **extra) -> Config:
        return load_config(config, tiny_overrides(name, iterations, **extra))

    return make
