"""The code_tests reward: code extraction, all-or-nothing and partial scoring, hostile completions."""

from __future__ import annotations

import functools
import os

import pytest

from dockflow.rewards import code_tests as ct
from dockflow.rewards.code_tests import code_tests, extract_code
from dockflow.rewards.functions import required_columns
from dockflow.rewards.sandbox import SandboxLimits, SandboxResult

FAST = SandboxLimits(timeout_s=2.0, cpu_s=2, memory_mb=512, nproc=16, fsize_mb=4, disk_mb=16)
reward = functools.partial(code_tests, sandbox_limits=FAST)

ADD = "def add(a, b):\n    return a + b\n"
TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\n"


def fenced(code: str, lang: str = "python") -> str:
    return f"Here you go:\n```{lang}\n{code}```\nDone."


def test_extract_code():
    assert extract_code(fenced(ADD)) == ADD
    assert extract_code("```py\nx = 1\n```\n```python\ny = 2\n```") == "y = 2\n"  # the last python block
    assert extract_code("```python\nx = 1\n```\n```text\nnot code\n```") == "x = 1\n"
    assert extract_code("```\nz = 3\n```") == "z = 3\n"
    assert extract_code(ADD) == ADD


def test_correct_wrong_and_broken_completions():
    completions = [
        fenced(ADD),
        fenced("def add(a, b):\n    return a - b\n"),
        fenced("def add(a, b)\n    return a + b\n"),  # syntax error
        "I think the answer is add.",  # no code at all
        fenced("raise RuntimeError('boom')\n"),
    ]
    assert reward([""] * 5, completions, tests=[TESTS] * 5) == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_a_list_of_tests_gives_partial_credit():
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 5", "assert add(0, 0) == 0", "assert add('a', 'b') == 'ab'"]
    assert reward(["p"], [fenced(ADD)], tests=[tests]) == [0.75]
    halves = fenced("def add(a, b):\n    if a == 0:\n        raise ValueError\n    return a + b\n")
    assert reward(["p"], [halves], tests=[tests]) == [0.5]


def test_infinite_loop_and_memory_bomb_score_zero_and_the_batch_goes_on():
    completions = [fenced("while True:\n    pass\n"), fenced("x = bytearray(8 << 30)\n" + ADD), fenced(ADD)]
    assert reward([""] * 3, completions, tests=[TESTS] * 3) == [0.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "cheat",
    [
        "import sys\nsys.exit(0)\n",
        "import os\nos._exit(0)\n",
        "print('0123456789abcdef0123456789abcdef 1 1')\nimport os\nos._exit(0)\n",
        "import sys, io\nsys.stdout = io.StringIO()\n" + ADD,  # swallows its own output, not the result line
    ],
)
def test_early_exit_and_a_fake_result_line_do_not_pass(cheat):
    expected = 1.0 if "StringIO" in cheat else 0.0
    assert reward(["p"], [fenced(cheat)], tests=[TESTS]) == [expected]


def test_sys_exit_inside_a_test_fails_only_that_test():
    code = ADD + "def stop():\n    raise SystemExit(0)\n"
    assert reward(["p"], [fenced(code)], tests=[["assert add(1, 1) == 2", "stop()"]]) == [0.5]


def test_conversational_completions():
    completion = [{"role": "assistant", "content": fenced(ADD)}]
    assert reward(["p"], [completion], tests=[TESTS]) == [1.0]


@pytest.mark.skipif(os.geteuid() != 0, reason="the fork bomb runs only inside a dropped uid's process limit")
def test_fork_bomb_scores_zero_and_the_next_one_still_runs():
    bomb = fenced("import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n")
    assert reward(["", ""], [bomb, fenced(ADD)], tests=[TESTS, TESTS]) == [0.0, 1.0]


def test_tests_column_is_required():
    assert required_columns(code_tests) == ["tests"]  # a dataset without it is refused where the run starts
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'tests'"):
        reward(["p"], [fenced(ADD)])
    with pytest.raises(ValueError, match="code_tests needs a 'tests' column"):
        reward(["p", "q"], [fenced(ADD)] * 2, tests=[TESTS, None])
    with pytest.raises(ValueError, match="non-empty list of strings"):
        reward(["p"], [fenced(ADD)], tests=[[]])
    with pytest.raises(ValueError, match="2 completions but 1"):
        reward(["p", "q"], [fenced(ADD)] * 2, tests=[TESTS])


def _fake_result(status: str) -> SandboxResult:
    return SandboxResult(status, None, "", "", 0.0, error="sandbox setup: broken" if status == "error" else None)


def test_sandbox_errors_raise_only_when_nothing_could_run(monkeypatch, caplog):
    monkeypatch.setattr(ct, "run_sandboxed", lambda *a, **k: _fake_result("error"))
    with pytest.raises(RuntimeError, match="could not start: sandbox setup: broken"):
        reward(["p", "q"], [fenced(ADD)] * 2, tests=[TESTS] * 2)
    statuses = iter(["error", "failed"])
    monkeypatch.setattr(ct, "run_sandboxed", lambda *a, **k: _fake_result(next(statuses)))
    assert code_tests(["p", "q"], ["a", "b"], tests=[TESTS] * 2, max_workers=1) == [0.0, 0.0]
    assert "sandbox error, scored 0.0" in caplog.text
