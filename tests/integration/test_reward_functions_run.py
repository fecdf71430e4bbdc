"""A user's reward functions end to end: a module that exists only in the test's temporary directory reaches the
Ray workers (shipped as a py_module), combines with the built-in math_verify, and each function's mean reaches
MLflow under TRL's key; a function that raises stops `dockflow train` with one line (exit 2), no worker left."""

from __future__ import annotations

import math
import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from dockflow.cli import main
from dockflow.flow.trainer import train
from dockflow.tracking import read_metric_history, resolve_tracking_uri

pytestmark = pytest.mark.slow

USER_REWARDS = textwrap.dedent('''
    def exact(prompts, completions, **kwargs):
        """A reward function as written for TRL's GRPOTrainer: dataset columns arrive in kwargs."""
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, kwargs["answer"])]

    def brevity(prompts, completions, completion_ids, **kwargs):
        return [None if not ids else 1.0 / len(ids) for ids in completion_ids]

    def odd_answers_only(prompts, completions, answer, **kwargs):
        """Applies to some rows only: None elsewhere, so those samples are unscorable."""
        return [None if int(a) % 2 == 0 else float(c.strip() == a) for c, a in zip(completions, answer)]

    def broken(prompts, completions, **kwargs):
        raise ValueError("the scoring service refused " + prompts[0])
''')


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "user_code"
    where.mkdir()
    (where / "team_rewards.py").write_text(USER_REWARDS)
    monkeypatch.syspath_prepend(str(where))  # importable by the driver only: Ray must ship it
    return where


def test_user_functions_combine_with_math_verify_and_log_per_function(tiny_config, user_module: Path) -> None:
    import ray

    assert not ray.is_initialized()  # the run starts its own cluster, with the run's runtime environment
    functions = ("[{name: math_verify, weight: 1.0}, {path: 'team_rewards:exact', weight: 0.5}, "
                 "{path: 'team_rewards:brevity', weight: 0.1}]")
    cfg = tiny_config("user_rewards", 2, reward__functions=functions, data__chat_template="true")
    summary = train(cfg)
    uri = resolve_tracking_uri(cfg.tracking.uri, cfg.run.output_dir)
    for key in ("rewards/math_verify/mean", "rewards/exact/mean", "rewards/brevity/mean", "reward/mean"):
        assert [step for step, _ in read_metric_history(uri, summary["mlflow_run_id"], key)] == [1, 2], key
    exact = read_metric_history(uri, summary["mlflow_run_id"], "rewards/exact/mean")
    verified = read_metric_history(uri, summary["mlflow_run_id"], "rewards/math_verify/mean")
    assert exact == verified  # the TRL-style function and the verifier agree on 1-digit sums


def test_unscorable_samples_train_through_the_critic_path(tiny_config, user_module: Path) -> None:
    cfg = tiny_config("unscorable", 1, config="configs/ppo_arith.yaml",
                      reward__functions="[{path: 'team_rewards:odd_answers_only'}]")
    summary = train(cfg)
    uri = resolve_tracking_uri(cfg.tracking.uri, cfg.run.output_dir)

    def last(key: str) -> float:
        return read_metric_history(uri, summary["mlflow_run_id"], key)[-1][1]

    assert 0.0 < last("reward/unscorable_fraction") < 1.0  # even answers: no reward applies
    for key in ("reward/mean", "train/loss", "critic/value_loss"):
        assert math.isfinite(last(key)), key


def test_a_raising_function_stops_the_cli_with_one_line(
    tiny_overrides, user_module: Path, capsys, caplog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dockflow train`` (``dockflow.cli.main`` in this process; the module is on the driver's ``sys.path`` only,
    so the run must ship it) returns 2 with one line that names the function, the sample and the stage."""
    overrides = tiny_overrides("broken_reward", 2, reward__functions="[{path: 'team_rewards:broken'}]",
                               dock__backend="centralized")  # one dock actor: the dock is not what this run tests
    # The run's own Ray cluster, its workers and their reward children inherit this; the other pytest worker's
    # runs (started at the same time, with their own RewardWorkers) do not.
    tag = f"broken-reward-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv("DOCKFLOW_TEST_RUN_TAG", tag)
    assert main(["train", "configs/grpo_arith.yaml", *overrides]) == 2
    err = capsys.readouterr().err  # the CLI's stderr and the workers' logs, which Ray prints there
    last = err.strip().splitlines()[-1]
    assert last.startswith("dockflow train: error: ") and "Traceback" not in err, err[-3000:]
    assert "Traceback" not in caplog.text  # what the CLI's logging would print to stderr (pytest captures it)
    assert "reward function 'broken' raised ValueError: the scoring service refused" in last
    assert "on sample 0" in last and "iteration 0: stage 'reward' failed: reward function 'broken'" in last
    assert "RewardError" not in last  # the worker's error reaches the user as its message, not its repr
    assert not _reward_processes(tag), "a reward process or worker outlived the run"


def _reward_processes(tag: str) -> set[str]:
    """This run's reward workers and reward children still alive: the ones whose environment holds ``tag``."""
    found = subprocess.run(["pgrep", "-f", "dockflow.rewards.runner|ray::RewardWorker"], capture_output=True, text=True)
    return {pid for pid in found.stdout.split() if _has_tag(pid, tag)}


def _has_tag(pid: str, tag: str) -> bool:
    try:
        return f"DOCKFLOW_TEST_RUN_TAG={tag}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone since pgrep saw it, or not ours to read
        return False


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


def test_a_conversational_dataset_with_a_calculator_tool_trains_with_trls_think_format_reward(
    tiny_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's run: prompts as lists of messages, rendered by the tiny tokenizer's chat template in rollouts and
    evaluation, scored by the built-in verifier and by TRL's own ``think_format_reward`` (which needs conversational
    completions), unchanged; the actor runs the multi-turn tool loop with a calculator tool whose module exists
    only in the test's temporary directory (shipped to the Ray workers as reward modules are), and the
    per-trajectory tool metrics reach MLflow every iteration; held-out evaluation runs the same tool loop. Two
    iterations teach the tiny model nothing: this
    checks the wiring; ``tests/unit/rollout/test_tool_rollouts.py`` checks the mask."""
    import json

    where = tmp_path / "user_code"
    where.mkdir()
    (where / "calc_tools.py").write_text(USER_TOOLS)
    monkeypatch.syspath_prepend(str(where))  # importable by the driver only: Ray must ship it
    rows = [{"prompt": [{"role": "system", "content": "Answer with the number."},
                        {"role": "user", "content": f"What is {a} + {b}?"}], "answer": a + b}
            for a in range(10) for b in range(4)]
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    functions = "[{name: math_verify}, {path: 'trl.rewards:think_format_reward', weight: 0.1}]"
    cfg = tiny_config("conversational", 2, reward__functions=functions, data__chat_template="true",
                      data__source="file", data__train_path=str(data), data__test_path=str(data),
                      data__arithmetic__num_val=8, sft__enabled=False, checkpoint__every=0, eval__num_prompts=8,
                      tools__functions="[calc_tools:calculator]", tools__max_total_tokens=160, tools__max_turns=2)
    summary = train(cfg)
    uri = resolve_tracking_uri(cfg.tracking.uri, cfg.run.output_dir)
    run_id = summary["mlflow_run_id"]
    for key in ("rewards/math_verify/mean", "rewards/think_format_reward/mean", "reward/mean", "tools/turns",
                "tools/tool_calls", "tools/tool_errors", "tools/timeouts", "tools/tool_token_share"):
        assert [step for step, _ in read_metric_history(uri, run_id, key)] == [1, 2], key
    assert all(v == 0.0 for _, v in read_metric_history(uri, run_id, "rewards/think_format_reward/mean"))
    assert all(1.0 <= v <= 2.0 for _, v in read_metric_history(uri, run_id, "tools/turns"))
    for key in ("eval/test_accuracy", "eval/test_tool_calls", "eval/test_tool_errors"):  # evaluated with the tool
        assert [s for s, _ in read_metric_history(uri, run_id, key)] == [0, 2], key
