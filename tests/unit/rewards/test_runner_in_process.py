"""Reward functions called in the reward worker itself (the built-ins, or ``isolate: false``) and beside the child
process: no process hop, the same checks and one-line errors, the timeout still enforced, the order kept."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from dockflow.config.reward import RewardFunctionConfig
from dockflow.rewards.functions import RewardError
from dockflow.rewards.runner import RewardRunner
from tests.unit.rewards.test_runner import USER_MODULE, batch

SLOW = textwrap.dedent('''
    import time

    def slow(prompts, completions, **kwargs):
        time.sleep(1.3)
        return [0.5 for _ in completions]
''')


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "user_rewards_here.py").write_text(USER_MODULE + SLOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_rewards_here"


def runner(module: str, *names: str, here: tuple[str, ...], timeout_s: float = 20.0) -> RewardRunner:
    return RewardRunner([(n, f"{module}:{n}") for n in names], timeout_s, in_process=set(here))


def test_a_builtin_in_process_starts_no_child_and_reports_its_own_time() -> None:
    r = RewardRunner([("math_verify", "dockflow.rewards.builtins:math_verify")], 5, in_process={"math_verify"})
    r.start()
    try:
        out = r.score(batch())
        assert r.process is None  # nothing to isolate: no child process, no hop
    finally:
        r.close()
    assert out["math_verify"].values == [1.0, 0.0, 1.0]
    assert 0.0 < out["math_verify"].seconds < 5.0


def test_quick_in_process_and_isolated_functions_keep_the_configured_order(user_module: str) -> None:
    r = runner(user_module, "sees_everything", "trl_style", "awaited", here=("trl_style", "awaited"))
    try:
        out = r.score(batch())
        assert r.process is not None  # only sees_everything runs there
    finally:
        r.close()
    assert list(out) == ["sees_everything", "trl_style", "awaited"]  # the worker zips them with the weights
    assert out["trl_style"].values == [1.0, 0.0, 1.0] and out["awaited"].values == [1.0, 1.0, 2.0]
    assert out["sees_everything"].metrics == {"my/batch": 3.0}


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("raises_on_b", "reward function 'raises_on_b' raised KeyError: 'missing' on sample 41"),
        ("short", "reward function 'short' returned 1 values for 3 completions"),
        ("text", "reward function 'text' returned str '1.0' at sample 40"),
    ],
)
def test_an_in_process_function_that_misbehaves_names_itself(user_module: str, name: str, message: str) -> None:
    r = runner(user_module, name, here=(name,))
    with pytest.raises(RewardError) as err:
        r.score(batch())
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_slow_in_process_function_stops_the_run_when_it_returns(user_module: str) -> None:
    r = runner(user_module, "slow", here=("slow",), timeout_s=1.0)
    with pytest.raises(RewardError, match=r"'slow' on samples 40-42 ran past reward.timeout_s=1s \(it returned after"):
        r.score(batch())


def test_the_timeout_still_kills_an_isolated_function_beside_an_in_process_one(user_module: str) -> None:
    r = runner(user_module, "trl_style", "bigint", here=("trl_style",), timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"'bigint' on samples 40-42 ran past reward.timeout_s=1s; the reward pro"):
        r.score(batch())
    assert time.monotonic() - start < 10
    assert r.process is None  # killed


def test_the_child_clock_runs_while_in_process_functions_do(user_module: str) -> None:
    """The isolated function got the batch before the in-process one started: its timeout counts from then."""
    r = runner(user_module, "slow", "bigint", here=("slow",), timeout_s=2.0)
    r.start()  # the child's start-up (seconds on a loaded machine) is not what this test times
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"'bigint' on samples 40-42 ran past reward.timeout_s=2s; the reward pro"):
        r.score(batch())
    assert time.monotonic() - start < 3.0  # about 2 s, not 1.3 s here + 2 s there


@pytest.mark.parametrize(
    ("entry", "in_worker"),
    [
        ({"name": "math_verify"}, True),  # built-ins: in the worker
        ({"name": "code_tests"}, True),  # its sandbox isolates each completion
        ({"path": "my_rewards:f"}, False),  # user code: in the child process
        ({"path": "my_rewards:f", "isolate": False}, True),  # a quick function its author trusts
        ({"name": "reasoning_gym", "isolate": True}, False),
    ],
)
def test_where_a_configured_function_runs(entry: dict, in_worker: bool) -> None:
    assert RewardFunctionConfig(**entry).in_worker is in_worker
