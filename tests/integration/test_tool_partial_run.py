"""Partial rollout with tools end to end: the calculator demo shrunk to 1-digit sums (SFT on its tool-use
demonstrations, so trajectories are a call, the calculator's turn and an answer), GRPO on a generator worker one
version stale, every trajectory given a few model tokens per generation call. A run resumed from its checkpoint,
which holds trajectories parked mid-turn in a later turn, ends bit-identical to the uninterrupted run, as
``test_algorithms.py::test_a_run_resumed_with_generations_in_flight_repeats_and_loses_no_sample`` checks for
single-turn responses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dockflow.agents.parking import ParkedTrajectory
from dockflow.flow.trainer import train
from dockflow.storage import run_store
from dockflow.tracking import read_metric_history, resolve_tracking_uri

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster for both runs (``train`` joins it instead of starting its own)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="test-tool-partial")
    yield
    ray.shutdown()


def parked_trajectories(queue_state: dict) -> list[ParkedTrajectory]:
    """The trajectories the checkpointed queue holds parked (their groups' finished ones left out)."""
    return [item.outcome for group in queue_state["parked"] for item in group.data
            if isinstance(getattr(item, "outcome", None), ParkedTrajectory)]


def test_a_tool_run_resumed_with_parked_trajectories_repeats_bit_for_bit(ray_cluster, tiny_config) -> None:
    cfg = tiny_config("tool_partial", 4, config="configs/grpo_calculator.yaml", placement__mode="disaggregated",
                      placement__generator_cpus=0, train__max_staleness=1, rollout__partial__token_budget=5,
                      rollout__partial__max_age=3, checkpoint__keep=3, eval__every=0, dock__backend="centralized",
                      data__arithmetic__num_labeled=40)
    full = train(cfg)
    final = load_file(str(Path(full["final_model"]) / "model.safetensors"))
    uri = resolve_tracking_uri(cfg.tracking.uri, cfg.run.output_dir)
    history = {key: [v for _, v in read_metric_history(uri, full["mlflow_run_id"], key)]
               for key in ("flow/parked_groups", "flow/resumed_groups", "tools/turns", "rollout/samples")}
    assert history["rollout/samples"] == [cfg.global_batch] * 4
    assert sum(history["flow/parked_groups"]) > 0 and sum(history["flow/resumed_groups"]) > 0, history
    assert max(history["tools/turns"]) > 1.0, history  # the SFT model calls the calculator, then answers
    store = run_store(cfg.checkpoint, cfg.run)
    inflight = store.read_part(2, "inflight", weights_only=False)
    assert list(inflight["windows"]) == [2] and "tool_record" in inflight["windows"][2]["data"].keys()
    parked = parked_trajectories(inflight["queue"])
    where = sorted({(p.resumes_in, bool(p.turn)) for p in parked})
    assert any(turn for _, turn in where) and any(t > 1 for t, _ in where), where  # mid-turn, in a later turn
    store.delete(4)
    resumed = train(cfg, resume=True)
    assert resumed["resumed_from"] == 2 and resumed["samples_trained"] == 4 * cfg.train_batch
    same = ("accuracy_before", "accuracy_after", "evals", "reward_per_iteration", "iterations", "restarts",
            "mlflow_run_id", "sft/val_accuracy")
    assert {k: resumed[k] for k in same} == {k: full[k] for k in same}
    after = load_file(str(Path(resumed["final_model"]) / "model.safetensors"))
    assert all(torch.equal(final[k], after[k]) for k in final), "the resumed run's policy differs"
