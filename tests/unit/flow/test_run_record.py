"""The driver's record of a run (``RunRecord``): what the run records, its checkpoint part (a part of the format
before is refused in one line; the checkpoint ``tests/fixtures/old_driver_part``, which DockFlow at 92f1559 wrote
with pickled parts, is refused by the store before any part is read), and ``summary.json``."""

import logging
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from dockflow.config import load_config
from dockflow.flow.final_model import final_score, summary
from dockflow.flow.run_record import RECORD_FORMAT, RecordFormatError, RunRecord
from dockflow.storage.local import LocalCheckpointStore
from dockflow.storage.manifest import OldCheckpointError

OLD_PART_DIR = Path(__file__).parents[2] / "fixtures" / "old_driver_part"  # step-000003/, a committed checkpoint
SCORES_0 = {"eval/test_accuracy": 0.25, "eval/test_pass_at_8": 0.625}
SCORES_2 = {"eval/test_accuracy": 0.375, "eval/test_pass_at_8": 0.75}


def a_record() -> RunRecord:
    """Three iterations with an evaluation before RL and after iteration 2, a restart, iteration 3 generated ahead."""
    return RunRecord(
        iteration=3, samples=48, restarts=1, resumed_from=0, evals=[(0, dict(SCORES_0)), (2, dict(SCORES_2))],
        history=[{"reward/mean": 0.25, "perf/throughput_tps": 101.5, "timing/iteration_s": 2.5},
                 {"reward/mean": 0.5, "perf/throughput_tps": 98.25, "timing/iteration_s": 2.25},
                 {"reward/mean": 0.4375, "perf/throughput_tps": 103.0, "timing/iteration_s": 2.75}],
        init_metrics={"sft/val_accuracy": 0.3125, "sft/cached": 1.0}, mlflow_run_id="5f0c2a9e8b7d4c3e9a1b2c3d4e5f6a7b",
        inflight={3: {"rollout/response_length": 4.75, "rollout/policy_version": 3.0, "timing/generate_s": 1.5}},
    )


def test_a_pickled_checkpoint_is_refused_in_one_line_and_never_skipped():
    store = LocalCheckpointStore(OLD_PART_DIR, keep=3)
    for read in (store.latest, lambda: store.read_part(3, "driver")):
        with pytest.raises(OldCheckpointError) as err:
            read()
        assert "\n" not in str(err.value) and "pickled parts" in str(err.value) and "checkpoint.dir" in str(err.value)


def test_a_driver_part_of_the_format_before_is_refused_in_one_line():
    old = {"iteration": 3, "history": [], "evals": [(0, 0.25)], "samples": 48, "restarts": 0, "init_metrics": {},
           "mlflow_run_id": None, "resumed_from": None, "eval_scores": [], "inflight": {}}  # the fixture's keys
    with pytest.raises(RecordFormatError) as err:
        RunRecord.from_dict(old)
    assert "\n" not in str(err.value) and "format none" in str(err.value) and "start a new run" in str(err.value)


def test_the_part_is_plain_values_and_round_trips_through_a_store(tmp_path):
    rec = a_record()
    data = rec.to_dict()
    assert data["record_format"] == RECORD_FORMAT and data["evals"] == [[0, SCORES_0], [2, SCORES_2]]
    store = LocalCheckpointStore(tmp_path, keep=1)
    store.write_part(3, "driver", data)
    store.commit(3, {"iteration": 3})
    assert RunRecord.from_dict(store.read_part(3, "driver")) == rec  # data only: no classes


def test_unknown_keys_are_dropped_with_a_warning_and_unknown_formats_refused(caplog):
    data = {**RunRecord(iteration=1).to_dict(), "future_field": [1]}
    with caplog.at_level(logging.WARNING, logger="dockflow.flow.run_record"):
        assert RunRecord.from_dict(data) == RunRecord(iteration=1)
    assert "future_field" in caplog.text
    with pytest.raises(RecordFormatError, match="format 3"):
        RunRecord.from_dict({**data, "record_format": 3})


def test_iterations_and_evaluations_are_recorded():
    rec = RunRecord(init_metrics={"sft/val_accuracy": 0.5})
    rec.record_eval(0, SCORES_0)
    metrics = {"reward/mean": 0.5, "perf/throughput_tps": 10.0, "timing/iteration_s": 1.0, "train/loss": 0.1}
    rec.record_iteration(1, metrics, samples=16)
    rec.record_iteration(2, {"reward/mean": 0.75}, samples=16)
    assert metrics["train/samples"] == 16.0 and rec.samples == 32 and rec.iteration == 2
    assert rec.history == [{"reward/mean": 0.5, "perf/throughput_tps": 10.0, "timing/iteration_s": 1.0},
                           {"reward/mean": 0.75}]
    assert rec.final_scores() is None  # no evaluation after iteration 2 yet
    rec.record_eval(2, SCORES_2)
    assert rec.final_scores() == SCORES_2 and rec.evaluated_steps == {0, 2}
    with pytest.raises(KeyError, match="eval/test_accuracy"):
        rec.record_eval(3, {"eval/other": 1.0})


def test_a_checkpoint_copy_does_not_change_with_the_run():
    rec = RunRecord(iteration=2, history=[{"reward/mean": 0.5}], evals=[(0, dict(SCORES_0))], samples=32)
    ahead = {2: {"rollout/response_length": 3.0}}
    saved = rec.checkpoint_copy(ahead)
    rec.record_iteration(3, {"reward/mean": 1.0}, samples=16)
    rec.record_eval(3, SCORES_2)
    rec.evals[0][1]["eval/test_accuracy"] = 0.0
    ahead[2]["rollout/response_length"] = 9.0
    assert saved == RunRecord(iteration=2, history=[{"reward/mean": 0.5}], evals=[(0, SCORES_0)], samples=32,
                              inflight={2: {"rollout/response_length": 3.0}})
    assert rec.inflight == {}


def test_a_restart_goes_on_from_the_checkpoint_or_keeps_the_evaluation_before_rl():
    rec = RunRecord(iteration=3, evals=[(0, SCORES_0), (2, SCORES_2)], samples=48, restarts=1,
                    init_metrics={"sft/cached": 1.0}, mlflow_run_id="run", resumed_from=2)
    fresh = rec.restarted(None)
    assert fresh == RunRecord(evals=[(0, SCORES_0)], restarts=2, init_metrics={"sft/cached": 1.0}, mlflow_run_id="run")
    ckpt = RunRecord(iteration=2, samples=32, restarts=0, mlflow_run_id="old", resumed_from=0)
    assert rec.restarted(ckpt) == RunRecord(iteration=2, samples=32, restarts=2, mlflow_run_id="run")


def test_summary_holds_the_record_in_its_order():
    """The expected dict is what ``summary`` at 92f1559 returned for this record (same keys, values and order)."""
    cfg = load_config("configs/grpo_arith.yaml", ["run.name=old"])
    out = summary(cfg, a_record(), "run-id", 12.5)
    expected = {
        "run_name": "old", "algorithm": "grpo", "samples_trained": 48, "restarts": 1, "resumed_from": 0,
        "accuracy_before": 0.25, "accuracy_after": 0.375, "iterations": 3, "throughput_tps": (101.5 + 98.25 + 103.0) / 3,
        "wall_seconds": 12.5, "mlflow_run_id": "run-id",
        "evals": [{"iteration": 0, "accuracy": 0.25, **SCORES_0}, {"iteration": 2, "accuracy": 0.375, **SCORES_2}],
        "reward_per_iteration": [0.25, 0.5, 0.4375], "seconds_per_iteration": 2.5,
        "sft/val_accuracy": 0.3125, "sft/cached": 1.0,
    }
    assert out == expected and list(out) == list(expected)
    empty = summary(cfg, RunRecord(), "r", 1.0)
    assert empty["accuracy_before"] is None and empty["accuracy_after"] is None and empty["evals"] == []


def test_the_registry_scores_the_evaluation_after_the_last_iteration():
    cfg = SimpleNamespace(registry=SimpleNamespace(score_metric="eval/test_pass_at_8"))
    rec = a_record()  # iteration 3, last evaluation after 2
    assert math.isnan(final_score(cfg, rec))
    rec.record_eval(3, SCORES_2)
    assert final_score(cfg, rec) == 0.75
