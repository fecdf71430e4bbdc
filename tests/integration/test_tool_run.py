"""A GRPO run with a calculator tool end to end: the tool module exists only in the test's temporary directory
(shipped to the Ray workers as the reward modules are), the actor runs the multi-turn loop on the HF engine,
and the per-trajectory tool metrics reach MLflow every iteration. Two iterations teach the tiny model nothing;
this checks the wiring, ``tests/unit/agents/test_tool_rollouts.py`` the mask."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dockflow.flow.trainer import train
from dockflow.tracking import read_metric_history, resolve_tracking_uri

pytestmark = pytest.mark.slow

USER_TOOLS = textwrap.dedent('''
    def calculator(a: int, op: str, b: int) -> int:
        """Add or subtract two integers.

        Args:
            a: The first integer.
            op: "+" or "-".
            b: The second integer.
        """
        return a + b if op == "+" else a - b
''')


def test_a_grpo_run_with_a_calculator_tool_logs_the_tool_metrics(tiny_config, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    where = tmp_path / "user_code"
    where.mkdir()
    (where / "calc_tools.py").write_text(USER_TOOLS)
    monkeypatch.syspath_prepend(str(where))  # importable by the driver only: Ray must ship it
    cfg = tiny_config("tool_run", 2, data__chat_template="true", tools__functions="[calc_tools:calculator]",
                      tools__max_total_tokens=160, tools__max_turns=2,
                      sft__enabled=False, checkpoint__every=0, eval__num_prompts=8)
    summary = train(cfg)
    uri = resolve_tracking_uri(cfg.tracking.uri, cfg.run.output_dir)
    for key in ("tools/turns", "tools/tool_calls", "tools/tool_errors", "tools/timeouts", "tools/tool_token_share"):
        history = read_metric_history(uri, summary["mlflow_run_id"], key)
        assert [step for step, _ in history] == [1, 2], key
    turns = [v for _, v in read_metric_history(uri, summary["mlflow_run_id"], "tools/turns")]
    assert all(1.0 <= t <= 2.0 for t in turns)
    assert [s for s, _ in read_metric_history(uri, summary["mlflow_run_id"], "reward/mean")] == [1, 2]
