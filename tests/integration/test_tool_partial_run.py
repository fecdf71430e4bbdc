"""Partial rollout with tools end to end: the calculator demo shrunk to 1-digit sums (SFT on its tool-use
demonstrations, so trajectories are a call, the calculator's turn and an answer), GRPO on a generator worker one
version stale, every trajectory given its calculator call's tokens plus one per generation call. A run resumed from its checkpoint,
which holds trajectories parked mid-turn in a later turn, ends bit-identical to the uninterrupted run, as
``test_algorithms.py::test_a_run_resumed_with_generations_in_flight_repeats_and_loses_no_sample`` checks for
single-turn responses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dockflow.agents.demonstrations import assistant_turn_ids
from dockflow.agents.parking import ParkedTrajectory
from dockflow.config import Config
from dockflow.data import load_task
from dockflow.flow.sft import SFTInputs, sft_warm_start
from dockflow.flow.tool_sft import ToolDemonstrations
from dockflow.flow.trainer import train
from dockflow.models import load_tokenizer
from dockflow.rollout.queue import checkpoint_types
from dockflow.storage import run_store
from dockflow.tracking import read_metric_history, resolve_tracking_uri
from dockflow.workers.resources import build_plan

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


def parking_points(store, steps: list[int]) -> dict[int, list[tuple[int, bool]]]:
    """For each checkpoint, where its parked trajectories stopped: (the turn they resume in, mid-turn or not)."""
    return {step: sorted({(p.resumes_in, bool(p.turn)) for p in parked_trajectories(
        store.read_part(step, "inflight", types=checkpoint_types())["queue"])}) for step in steps}


def demonstrated_call_tokens(cfg: Config) -> int:
    """Model tokens of the first turn of a demonstration (the calculator call, its EOS) under the run's tokenizer:
    the SFT warm start's, built here first (cached: the run reuses it)."""
    inputs = SFTInputs(cfg.model, cfg.data, cfg.sft, cfg.checkpoint, cfg.run.seed, cfg.rollout.max_new_tokens,
                       cfg.eval.batch_size, cfg.tools)
    tokenizer = load_tokenizer(sft_warm_start(inputs, Path(cfg.run.output_dir) / "sft_probe").model_dir)
    demos = ToolDemonstrations(cfg.data, cfg.tools, cfg.sft.demonstrations, load_task(cfg.data, cfg.run.seed).labeled)
    return len(assistant_turn_ids(tokenizer, demos.completions[0][0]))


def test_a_tool_run_resumed_with_parked_trajectories_repeats_bit_for_bit(ray_cluster, tiny_config) -> None:
    """The state is made, not hoped for: each generation call gives a trajectory its demonstrated call's tokens
    plus one, so one that calls the calculator as the SFT taught it (1-digit operands: the same length every time)
    ends its first turn, gets the calculator's result and is parked one token into its answer, in its second turn.
    Which texts are sampled still follows the CPU's rounding (AVX2 and AVX-512 sample others), so every checkpoint
    is kept and the run resumes from the first that holds such a trajectory; the failure says so if none does.
    About 35 s: a 4-iteration run and its resume from a checkpoint (the SFT warm start is the suite's cached one)."""
    options = dict(config="configs/grpo_calculator.yaml", placement__mode="disaggregated", placement__generator_cpus=0,
                   train__max_staleness=1, rollout__partial__max_age=3, checkpoint__every=1, checkpoint__keep=4,
                   eval__every=0, dock__backend="centralized", data__arithmetic__num_labeled=40,
                   rollout__temperature=0.7)
    budget = demonstrated_call_tokens(tiny_config("tool_partial", 4, **options)) + 1
    cfg = tiny_config("tool_partial", 4, rollout__partial__token_budget=budget, **options)
    full = train(cfg)
    final = load_file(str(Path(full["final_model"]) / "model.safetensors"))
    uri = resolve_tracking_uri(cfg.tracking.uri, cfg.run.output_dir)
    history = {key: [v for _, v in read_metric_history(uri, full["mlflow_run_id"], key)]
               for key in ("flow/parked_groups", "flow/resumed_groups", "tools/turns", "rollout/samples")}
    assert history["rollout/samples"] == [cfg.global_batch] * 4
    assert sum(history["flow/parked_groups"]) > 0 and sum(history["flow/resumed_groups"]) > 0, history
    assert max(history["tools/turns"]) > 1.0, history  # the SFT model calls the calculator, then answers
    store = run_store(cfg.checkpoint, cfg.run)
    assert store.list_steps() == [1, 2, 3, 4]
    where = parking_points(store, [1, 2, 3])
    later = [step for step, points in where.items() if any(t > 1 and mid for t, mid in points)]
    assert later, ("precondition not met: no checkpoint holds a trajectory parked mid-turn in a later turn "
                   f"((turn, mid-turn) per checkpoint: {where}, token budget {budget}); the sampled texts "
                   "decide it: no trajectory called the calculator as demonstrated")
    step = later[0]
    inflight = store.read_part(step, "inflight", types=checkpoint_types())
    assert list(inflight["windows"]) == [step] and "tool_record" in inflight["windows"][step]["data"].keys()
    for newer in range(step + 1, 5):
        store.delete(newer)
    resumed = train(cfg, resume=True)
    assert resumed["resumed_from"] == step and resumed["samples_trained"] == 4 * build_plan(cfg).train_batch
    same = ("accuracy_before", "accuracy_after", "evals", "reward_per_iteration", "iterations", "restarts",
            "mlflow_run_id", "sft/val_accuracy")
    assert {k: resumed[k] for k in same} == {k: full[k] for k in same}
    after = load_file(str(Path(resumed["final_model"]) / "model.safetensors"))
    assert all(torch.equal(final[k], after[k]) for k in final), "the resumed run's policy differs"
    print(f"parking points per checkpoint: {where}; resumed from {step}")
