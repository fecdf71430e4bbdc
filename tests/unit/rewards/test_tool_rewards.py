"""Reward functions of a tool run get what TRL 1.16's GRPOTrainer passes: the prompt as the model saw it, the
multi-turn completion (assistant turns with tool calls, tool messages), every completion token, and with an
environment_factory the rollouts' instances as ``environments=``; each environment class's ``get_reward()`` is a
reward source of weight 1 named after the class (``dockflow.workers.reward.tool_view``)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest
import torch

from dockflow.agents.records import RecordTooLarge, TrajectoryRecord, pack_record, unpack_record
from dockflow.rewards.functions import combine, completion_text
from dockflow.rewards.runner import RewardBatch, RewardRunner, RunState
from dockflow.workers.reward import tool_view
from tests.unit.agents.tools_for_tests import Counter

CALL = {"type": "function", "function": {"name": "increment", "arguments": {"by": 2}}}


def _record(count: int, target: int, reward: float | None, env: str | None = "Counter") -> TrajectoryRecord:
    state = Counter()
    state.reset(target=target)
    state.count = count
    completion = [{"role": "assistant", "content": "", "tool_calls": [CALL]},
                  {"role": "tool", "name": "increment", "content": str(count)},
                  {"role": "assistant", "content": f"It is {count}."}]
    prompt = [{"role": "user", "content": f"Count to {target}. (counter at 0, target {target})"}]
    return TrajectoryRecord(prompt, completion, state, reward, env)


USER = textwrap.dedent('''
    def reached(prompts, completions, environments, **kwargs):
        """As a TRL user writes it: the rollouts' environment instances arrive as environments=."""
        return [float(env.count == env.target) for env in environments]

    def final_turn(prompts, completions, completion_ids, **kwargs):
        return [float(c[-1]["role"] == "assistant" and len(c) == 3) + 0.0 * len(ids)
                for c, ids in zip(completions, completion_ids)]
''')


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "env_rewards.py").write_text(USER)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "env_rewards"


def test_records_round_trip_through_the_dock_row_and_refuse_to_be_cut() -> None:
    rec = _record(2, 2, 1.0)
    row = pack_record(rec, 4096)
    assert row.dtype.name == "uint8" and row.shape == (4096,)
    back = unpack_record(torch.from_numpy(row))
    assert (back.completion, back.state.count, back.reward) == (rec.completion, 2, 1.0)
    with pytest.raises(RecordTooLarge, match=r"environment 'Counter' included\) takes \d+ bytes, more than "
                                             r"tools.record_bytes=64: raise tools.record_bytes"):
        pack_record(rec, 64)


def test_reward_functions_get_trls_multi_turn_arguments_and_the_environments(user_module: str) -> None:
    records = [_record(2, 2, 1.0), _record(2, 3, 0.0), _record(3, 3, None)]
    responses = torch.arange(30).reshape(3, 10)
    view = tool_view(records, responses, [4, 10, 6], ["Counter"], environments=True)
    assert view.prompts[1] == records[1].prompt and view.completions[0] == records[0].completion
    assert view.completion_ids == [list(range(4)), list(range(10, 20)), list(range(20, 26))]  # tool tokens too
    assert view.texts == ["It is 2.", "It is 2.", "It is 3."]  # the verifier scores the final answer
    assert view.environment_rewards[0][:2] == [1.0, 0.0] and math.isnan(view.environment_rewards[0][2])
    runner = RewardRunner([("reached", f"{user_module}:reached"), ("final_turn", f"{user_module}:final_turn"),
                           ("math_verify", "dockflow.rewards.builtins:math_verify"),
                           ("think_format_reward", "trl.rewards:think_format_reward")],
                          timeout_s=60, in_process={"math_verify"})
    try:  # the user's functions in the child process: the instances are pickled there and back intact
        out = runner.score(RewardBatch(view.prompts, view.completions, view.completion_ids,
                                       {"answer": ["2", "3", "3"]}, RunState(0, 2), environments=view.environments))
    finally:
        runner.close()
    assert out["reached"].values == [1.0, 0.0, 1.0]
    assert out["final_turn"].values == [1.0, 1.0, 1.0]
    assert out["math_verify"].values == [1.0, 0.0, 1.0]  # on the last assistant turn, not the tool's result
    assert out["think_format_reward"].values == [0.0, 0.0, 0.0]  # TRL's own, unchanged, on multi-turn completions
    # the environment's column joins the sum with weight 1; a rollout whose get_reward gave nothing is skipped
    assert combine([out["math_verify"].values, view.environment_rewards[0]], [1.0, 1.0]) == [2.0, 0.0, 1.0]


def test_without_an_environment_no_environments_are_passed_and_tool_results_are_not_answers() -> None:
    view = tool_view([_record(2, 2, None, env=None)], torch.zeros(1, 4, dtype=torch.long), [4], [], environments=False)
    assert view.environments is None and view.environment_rewards == []
    assert completion_text([{"role": "assistant", "content": "", "tool_calls": [CALL]},
                            {"role": "tool", "name": "increment", "content": "7"}]) == ""
    assert completion_text([{"content": "7"}]) == "7"  # TRL's own test completions have no role
