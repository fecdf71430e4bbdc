"""The reference answer under whatever column ``data.answer_key`` names: every built-in gets it as ``answer``
through the reward worker's call (the rows loaded as a run loads them, for the documented prompt_key / answer_key /
chat template combinations; ``row_columns``; ``RewardRunner.score`` in the worker and in its child process), while
a user's function gets every column under its own name; a function that requires a column the rows lack is refused
where the run starts, in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dockflow.config import load_config
from dockflow.config.reward import RewardFunctionConfig
from dockflow.data import columns_of, load_task, task_columns
from dockflow.data.reasoning_gym import generate_reasoning_gym
from dockflow.rewards.builtins import BUILTINS
from dockflow.rewards.functions import (
    RewardError,
    check_columns,
    function_path,
    import_function,
    required_columns,
)
from dockflow.rewards.runner import RewardBatch, RewardRunner, RunState
from dockflow.workers.reward import row_columns

CODE = "```python\ndef f(x):\n    return 2 * x\n```"
ROWS = [  # a reasoning-gym chain_sum row scores against its reference answer; code_tests reads 'tests'
    {"solution": "7", "tests": "assert f(2) == 4", "metadata": {"source_dataset": "chain_sum"}, "level": 1},
    {"solution": "12", "tests": "assert f(3) == 5", "metadata": {"source_dataset": "chain_sum"}},
]
# built-in -> (completions, what it gives them with the reference answers 7 and 12)
EXPECTED = {
    "math_verify": (["7", "13"], [1.0, 0.0]),
    "reasoning_gym": (["7", "12"], [1.0, 1.0]),  # chain_sum's scorer compares with the reference answer
    "code_tests": ([CODE, CODE], [1.0, 0.0]),  # the 'tests' column, under its own name
}
# (prompt column, data.prompt_key, conversational prompts + data.chat_template): the documented combinations
LAYOUTS = [("prompt", None, False), ("problem", None, False), ("question", "question", False),
           ("prompt", None, True), ("question", "question", True)]


USER_MODULE = '''
def echo_columns(prompts, completions, **kwargs):
    """A user's TRL function: 1.0 where it got the columns under their own names (and no 'answer' alias)."""
    ok = "answer" not in kwargs and kwargs["solution"] == ["7", "12"] and kwargs["level"] == [1, None]
    return [float(ok)] * len(completions)
'''


def _data(tmp_path: Path, layout: tuple[str, str | None, bool]) -> list[str]:
    """Config overrides of a file task whose rows are ROWS with their prompt in ``layout``'s form."""
    column, key, chat = layout
    rows = [{column: [{"role": "user", "content": f"Q{i}"}] if chat else f"Q{i}", **r} for i, r in enumerate(ROWS)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["data.source=file", f"data.train_path={path}", f"data.test_path={path}", "data.answer_key=solution",
            f"data.prompt_key={key or 'null'}", f"data.chat_template={str(chat).lower()}", "data.arithmetic.num_val=0"]


# each layout in the reward worker; one (the pickled batch is the same for all) with math_verify and the user's
# function in the worker's child process
CASES = [*((layout, False) for layout in LAYOUTS), (LAYOUTS[-1], True)]


@pytest.mark.parametrize(("layout", "isolate"), CASES,
                         ids=[f"{x[0]}-{'chat' if x[2] else 'text'}{'-isolated' if i else ''}" for x, i in CASES])
def test_every_builtin_reads_the_reference_answer_whatever_its_column(
    tmp_path: Path, layout: tuple, isolate: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "answer_key_rewards.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))  # the child process gets this sys.path
    functions = [*(RewardFunctionConfig(name=n, isolate=isolate and n == "math_verify") for n in BUILTINS),
                 RewardFunctionConfig(path="answer_key_rewards:echo_columns", isolate=isolate)]
    cfg = load_config("configs/grpo_arith.yaml", _data(tmp_path, layout) + [
        f"reward.functions={json.dumps([f.model_dump() for f in functions])}"])
    rows = load_task(cfg.data, cfg.run.seed).train  # as the reward worker loads them
    names = columns_of(rows, cfg.data.answer_key)
    assert names == ["solution", "tests", "metadata", "level"] == task_columns(cfg.data, cfg.run.seed)
    check_columns({f.label: required_columns(import_function(function_path(f))) for f in cfg.reward.functions},
                  names, cfg.data.answer_key)  # nothing is refused at start
    runner = RewardRunner([(f.label, function_path(f)) for f in cfg.reward.functions], timeout_s=60,
                          in_process={f.label for f in cfg.reward.functions if f.in_worker})
    try:
        for name, (completions, expected) in EXPECTED.items():
            if layout[2]:
                completions = [[{"role": "assistant", "content": c}] for c in completions]
            out = runner.score(RewardBatch([r.prompt for r in rows], completions, [[1]] * 2,
                                           row_columns(rows, "solution", names), RunState(0, 1), answer_key="solution"))
            assert out[name].values == expected, (name, layout)
            assert out["echo_columns"].values == [1.0, 1.0]
    finally:
        runner.close()


def test_a_function_that_requires_a_missing_column_is_refused_in_one_line(tmp_path: Path) -> None:
    def exact(prompts: list, completions: list, answer: list, *, level: list, bonus: float = 0.0, **kw: Any) -> list:
        return [0.0] * len(completions)

    assert required_columns(exact) == ["answer", "level"]  # what every call passes, and defaults, are left out
    assert required_columns(import_function(BUILTINS["math_verify"])) == []  # it reads the reference as 'answer'
    assert required_columns(import_function(BUILTINS["reasoning_gym"])) == ["metadata"]
    assert required_columns(import_function(BUILTINS["code_tests"])) == ["tests"]
    with pytest.raises(RewardError) as err:
        check_columns({"math_verify": [], "exact": required_columns(exact)}, ["solution", "level"], "solution")
    line = str(err.value)
    assert line.startswith("reward function 'exact' requires the column 'answer', which the train rows lack") and \
        "(their columns: solution, level; the reference answer is data.answer_key='solution')" in line and \
        "set data.answer_key" in line and "\n" not in line
    check_columns({"exact": ["answer", "level"]}, ["answer", "level"], "answer")


def test_the_synthetic_tasks_columns_are_those_their_rows_have() -> None:
    for overrides in ([], ["data.source=reasoning_gym", "data.reasoning_gym.num_train=20",
                           "data.reasoning_gym.num_test=5", "data.reasoning_gym.num_val=5",
                           "data.reasoning_gym.num_labeled=5"]):
        data = load_config("configs/grpo_arith.yaml", overrides).data
        rows = (load_task(data, 0) if data.source == "arithmetic" else generate_reasoning_gym(data.reasoning_gym, 0)).train
        assert task_columns(data, 0) == columns_of(rows, data.answer_key), overrides
