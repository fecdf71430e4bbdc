"""Reward functions in their child process: TRL's keyword arguments, and every way a function can misbehave
ending in one RewardError that names it and the sample, never a hang or a silent 0."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dockflow.rewards.functions import RewardError
from dockflow.rewards.runner import RewardBatch, RewardRunner, RunState

USER_MODULE = textwrap.dedent('''
    import asyncio, os

    def trl_style(prompts, completions, **kwargs):
        # a TRL reward function: dataset columns arrive by name, as lists
        return [float(c.strip() == a) for c, a in zip(completions, kwargs["answer"])]

    def sees_everything(prompts, completions, completion_ids, answer, level, trainer_state, log_metric, **kwargs):
        log_metric("my/batch", float(len(completions)))
        return [None if lv is None else trainer_state.global_step + len(ids) for ids, lv in zip(completion_ids, level)]

    async def awaited(prompts, completions, **kwargs):
        await asyncio.sleep(0)
        return [float(len(c)) for c in completions]

    def raises_on_b(prompts, completions, **kwargs):
        return [1.0 if c != "b" else {}["missing"] for c in completions]

    def short(prompts, completions, **kwargs):
        return [1.0]

    def text(prompts, completions, **kwargs):
        return ["1.0" for _ in completions]

    def infinite(prompts, completions, **kwargs):
        return [float("inf") for _ in completions]

    def bigint(prompts, completions, **kwargs):
        return [9**9**9 for _ in completions]  # holds the interpreter: only a process boundary stops it

    def exits(prompts, completions, **kwargs):
        os._exit(3)
''')


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "user_rewards.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))  # the child takes the parent's sys.path
    return "user_rewards"


def batch() -> RewardBatch:
    return RewardBatch(
        prompts=["1+1?", "1+2?", "1+3?"], completions=["2", "b", " 4"], completion_ids=[[5, 2], [6, 7, 2], [5]],
        columns={"answer": ["2", "3", "4"], "level": [1, None, 2]}, state=RunState(global_step=7, max_steps=10),
        sample_ids=[40, 41, 42],
    )


def run(module: str, *names: str, timeout_s: float = 20.0) -> dict:
    runner = RewardRunner([(n, f"{module}:{n}") for n in names], timeout_s)
    try:
        return runner.score(batch())
    finally:
        runner.close()


def test_trl_functions_get_columns_ids_state_and_log_metric(user_module: str) -> None:
    out = run(user_module, "trl_style", "sees_everything", "awaited")
    assert out["trl_style"].values == [1.0, 0.0, 1.0]
    seen = out["sees_everything"].values
    assert seen[0] == 9.0 and math.isnan(seen[1]) and seen[2] == 8.0  # None -> not applicable
    assert out["sees_everything"].metrics == {"my/batch": 3.0}
    assert out["awaited"].values == [1.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("raises_on_b", "reward function 'raises_on_b' raised KeyError: 'missing' on sample 41"),
        ("short", "reward function 'short' returned 1 values for 3 completions"),
        ("text", "reward function 'text' returned str '1.0' at sample 40"),
        ("infinite", "reward function 'infinite' returned inf at sample 40"),
        ("exits", "the reward process died (exit code 3) while reward function 'exits' on samples 40-42"),
    ],
)
def test_misbehaving_functions_stop_with_one_line(user_module: str, name: str, message: str) -> None:
    with pytest.raises(RewardError) as err:
        run(user_module, name)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_stuck_function_is_killed_at_the_timeout(user_module: str) -> None:
    runner = RewardRunner([("bigint", f"{user_module}:bigint")], timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"'bigint' on samples 40-42 ran past reward.timeout_s=1s"):
        runner.score(batch())
    assert time.monotonic() - start < 10
    assert runner.process is None  # killed, and the next call would start a fresh one


def test_the_child_dies_with_its_parent(user_module: str, tmp_path: Path) -> None:
    """A worker killed mid-call (Ray kills actors with SIGKILL) leaves no reward process behind."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from dockflow.rewards.runner import RewardRunner
        r = RewardRunner([("bigint", "{user_module}:bigint")], timeout_s=600)
        r.start()
        print(r.process.pid, flush=True)
        from tests.unit.rewards.test_runner import batch
        r.score(batch())
    '''))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parents[3])
    child = int(parent.stdout.readline())
    time.sleep(1.0)
    parent.kill()
    parent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        if "Z" in Path(f"/proc/{child}/stat").read_text().split(")")[1][:3]:
            break  # a zombie is dead (its parent, reaped by init, collects it)
        time.sleep(0.1)
    alive = Path(f"/proc/{child}").exists() and "Z" not in Path(f"/proc/{child}/stat").read_text().split(")")[1][:3]
    assert not alive


def test_a_module_that_does_not_import_fails_at_start() -> None:
    with pytest.raises(RewardError, match="cannot import module 'no_such_rewards'"):
        RewardRunner([("f", "no_such_rewards:f")], timeout_s=5).start()
