"""TRL's own reward functions, unchanged, on a conversational dataset through DockFlow's reward path: the rows
loaded from a file, the call the reward worker makes (``RewardRunner.score`` on a ``RewardBatch`` with the rows'
columns), the user's functions in the child process and the built-in verifier in the worker."""

from __future__ import annotations

import json
from pathlib import Path

from dockflow.data.loaders import load_examples
from dockflow.rewards.functions import trl_completions
from dockflow.rewards.runner import RewardBatch, RewardRunner, RunState
from dockflow.workers.reward import row_columns

ROWS = [
    {"prompt": [{"role": "system", "content": "Reason in <think> tags."}, {"role": "user", "content": "1/3 + 1/3?"}],
     "solution": r"\frac{2}{3}", "answer": "2/3"},
    {"prompt": [{"role": "user", "content": "What is 6 * 7?"}], "solution": "42", "answer": "42"},
    {"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "solution": "4", "answer": "4"},
]
TEXTS = [r"<think>two thirds</think>The answer is \boxed{\frac{2}{3}}", "<think>6*7</think>41", r"\boxed{4}"]


def test_trl_think_format_and_accuracy_rewards_run_unchanged_on_conversational_rows(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    rows = load_examples(path)
    prompts = [ex.prompt for ex in rows]
    completions = trl_completions(prompts, TEXTS)
    assert completions[0] == [{"role": "assistant", "content": TEXTS[0]}]  # TRL's conversational completion
    runner = RewardRunner([("think_format_reward", "trl.rewards:think_format_reward"),
                           ("accuracy_reward", "trl.rewards:accuracy_reward"),
                           ("math_verify", "dockflow.rewards.builtins:math_verify")],
                          timeout_s=60, in_process={"math_verify"})
    try:
        out = runner.score(RewardBatch(prompts, completions, [[1, 2]] * 3, row_columns(rows), RunState(0, 2)))
    finally:
        runner.close()
    assert out["think_format_reward"].values == [1.0, 1.0, 0.0]
    assert out["accuracy_reward"].values == [1.0, 0.0, 1.0]  # math-verify on the 'solution' column
    assert out["math_verify"].values == [0.0, 0.0, 1.0]  # the built-in reads the text ('2/3' is not a number)


def test_standard_rows_keep_string_prompts_and_completions() -> None:
    texts = ["4", "5"]
    assert trl_completions(["What is 2 + 2?", "What is 2 + 3?"], texts) is texts
    assert trl_completions([], []) == []
