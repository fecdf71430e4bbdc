from __future__ import annotations

import pytest

from dockflow.agents import (
    EnvironmentSpecError,
    environment_methods,
    pick_factory,
    run_rollout,
    with_observation,
)
from dockflow.agents.tool_host import ToolHost
from dockflow.config.tools import ToolsConfig
from tests.unit.agents.chat import call, scripted
from tests.unit.agents.tools_for_tests import Counter, Doubler, add

LIMITS = ToolsConfig(max_turns=4, max_tool_calls=8, max_total_tokens=4096, timeout_s=5.0)
ROW = {"prompt": [{"role": "user", "content": "Bring the counter to 3"}], "target": 3}


def test_methods_are_the_public_functions_but_reset_and_get_reward() -> None:
    assert sorted(environment_methods(Counter())) == ["increment", "stall"]

    class NoReset:
        def act(self) -> None:
            """Act."""

    with pytest.raises(EnvironmentSpecError, match="has no reset method"):
        environment_methods(NoReset())


def test_a_trl_environment_runs_unchanged(tokenizer) -> None:
    generate, _ = scripted(
        tokenizer, [call("increment", '{"by": 2}'), call("increment", '{"by": 1}'), "Done: 3."]
    )
    out = run_rollout(ROW, generate, tokenizer, [add], Counter, LIMITS)
    traj = out.trajectory
    assert (out.reward, out.environment, traj.finish) == (1.0, "Counter", "stop")
    assert (
        traj.messages[0]["content"] == "Bring the counter to 3 (counter at 0, target 3)"
    )  # reset's observation
    assert [m["content"] for m in traj.messages if m["role"] == "tool"] == ["2", "3"]
    assert ROW["prompt"][0]["content"] == "Bring the counter to 3"  # the row is left untouched


def test_the_schema_shown_is_the_one_trl_renders_from_the_methods(tokenizer) -> None:
    """TRL passes an environment's bound methods to apply_chat_template(tools=...); the prompt is the same."""
    env = Counter()
    trl_tools = [add, *(getattr(env, name) for name in ("increment", "stall"))]
    with ToolHost([add], factory=Counter) as host:
        ours = tokenizer.apply_chat_template(ROW["prompt"], tools=host.schemas(), tokenize=False)
    assert ours == tokenizer.apply_chat_template(ROW["prompt"], tools=trl_tools, tokenize=False)


def test_named_factories_pick_by_the_environment_column(tokenizer) -> None:
    factories = {"counter": Counter, "doubler": Doubler}
    assert pick_factory(factories, {"environment": "doubler", "x": 1}) == (Doubler, {"x": 1})
    with pytest.raises(EnvironmentSpecError, match=r"environment='tripler'.*\['counter', 'doubler'\]"):
        pick_factory(factories, {"environment": "tripler"})
    generate, _ = scripted(tokenizer, [call("double", "{}"), call("double", "{}"), "4"])
    row = {"prompt": [{"role": "user", "content": "Double twice"}], "environment": "doubler"}
    out = run_rollout(row, generate, tokenizer, [], factories, LIMITS)
    assert out.reward is None and out.environment == "Doubler"  # no get_reward: not scored by the environment
    assert [m["content"] for m in out.trajectory.messages if m["role"] == "tool"] == ["2", "4"]
    assert out.trajectory.messages[0]["content"] == "Double twice"  # reset returned None


def test_with_observation_appends_to_the_last_message() -> None:
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert with_observation(msgs, " o")[-1] == {"role": "user", "content": "u o"}
    assert with_observation(msgs, None) == msgs and msgs[-1]["content"] == "u"
