"""The summary a run prints at its end: accuracy per evaluation, totals, the evaluation's fingerprint and what the
champion gate compared."""

from __future__ import annotations

import io
import re

from rich.console import Console

from dockflow.report import print_train_summary


def test_summary_table_shows_the_fingerprint_and_the_comparison() -> None:
    summary = {
        "run_name": "r", "evals": [{"iteration": 0, "accuracy": 0.4}, {"iteration": 2, "accuracy": 0.6}],
        "reward_per_iteration": [0.1, 0.3], "accuracy_before": 0.4, "accuracy_after": 0.6, "iterations": 2,
        "throughput_tps": 10.0, "wall_seconds": 3.0, "mlflow_run_id": "abc",
        "evaluation": {"fingerprint": "9c0e1d2f3a4b5c6d", "num_prompts": "500", "test_set": "6f129356b14cd37b"},
        "registry": {"model_name": "m", "version": 3, "score": 0.6, "decision": "'champion' stays on v1",
                     "compared": "v3 0.6 on evaluation 9c0e1d2f3a4b5c6d vs v1 0.7 on evaluation 9c0e1d2f3a4b5c6d"},
    }  # fmt: skip
    out = io.StringIO()
    print_train_summary(summary, Console(file=out, width=250))
    text = out.getvalue()
    assert re.search(r"evaluation fingerprint +│ 9c0e1d2f3a4b5c6d \(500 prompts, test set 6f129356b14cd37b\)", text)
    assert re.search(r"compared +│ v3 0\.6 on evaluation 9c0e1d2f3a4b5c6d vs v1 0\.7 on evaluation", text)
    assert re.search(r"champion +│ 'champion' stays on v1", text)

    del summary["evaluation"], summary["registry"]  # a summary written before the identity existed still prints
    out = io.StringIO()
    print_train_summary(summary, Console(file=out, width=250))
    assert "fingerprint" not in out.getvalue() and "accuracy after RL" in out.getvalue()


def test_a_tool_run_shows_tool_calls_and_errors_per_trajectory_at_each_evaluation() -> None:
    tools = {"eval/test_tool_calls": 1.01, "eval/test_tool_errors": 0.1}
    summary = {
        "run_name": "calc", "evals": [{"iteration": 0, "accuracy": 0.296, **tools},
                                      {"iteration": 40, "accuracy": 0.726, "eval/test_tool_calls": 1.0,
                                       "eval/test_tool_errors": 0.005}],
        "reward_per_iteration": [0.5] * 40, "accuracy_before": 0.296, "accuracy_after": 0.726, "iterations": 40,
        "throughput_tps": 10.0, "wall_seconds": 3.0, "mlflow_run_id": "abc",
    }  # fmt: skip
    out = io.StringIO()
    print_train_summary(summary, Console(file=out, width=250))
    text = out.getvalue()
    assert "tool calls / trajectory" in text and "tool errors / trajectory" in text
    assert re.search(r"0 \(SFT plateau\) +│ +0\.296 +│ +1\.01 +│ +0\.10 +│ +- +│", text)
    assert re.search(r"40 +│ +0\.726 +│ +1\.00 +│ +0\.01 +│ +0\.500 +│", text)
