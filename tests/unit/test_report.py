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
