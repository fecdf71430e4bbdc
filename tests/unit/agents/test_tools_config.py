"""``tools:`` in ``Config``: what a run with tools needs, each refusal in one line naming the fix."""

from __future__ import annotations

import pytest

from dockflow.config import ConfigError, load_config
from dockflow.workers.resources import build_plan

TOOL = "tools.functions=[tests.unit.agents.tools_for_tests:add]"


def test_the_response_must_fit_in_the_trajectory() -> None:
    with pytest.raises(ConfigError, match="tools.max_total_tokens=8 must exceed rollout.max_new_tokens=8"):
        load_config(None, [TOOL, "data.chat_template=true", "tools.max_total_tokens=8"])


def test_no_tools_by_default_and_a_tool_run_validates_on_both_engines() -> None:
    assert not load_config(None).tools.enabled
    cfg = load_config(None, [TOOL, "data.chat_template=true"])
    assert cfg.tools.enabled and cfg.tools.functions == ["tests.unit.agents.tools_for_tests:add"]
    assert load_config(None, [TOOL, "data.chat_template=true", "engine.backend=vllm", "engine.device=cpu"]).tools.enabled


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ([], "data.chat_template"),
        (["data.chat_template=true", "engine.backend=cost_model"], "engine.backend"),
    ],
)
def test_what_the_tool_loop_cannot_run_is_refused(extra: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match=f"tools are configured but {named}"):
        load_config(None, [TOOL, *extra])


def test_partial_rollout_with_tools_validates_where_partial_rollout_does() -> None:
    """Partial rollout parks multi-turn trajectories too (``dockflow.agents.parking``); it still needs generator
    workers, with tools as without."""
    cfg = load_config(None, [TOOL, "data.chat_template=true", "placement.mode=disaggregated",
                             "rollout.partial.token_budget=64"])
    assert cfg.tools.enabled and cfg.rollout.partial.token_budget == 64
    with pytest.raises(ConfigError, match="needs placement.mode: disaggregated"):
        load_config(None, [TOOL, "data.chat_template=true", "rollout.partial.token_budget=64"])


def test_demonstrations_without_tools_are_refused_and_the_demo_config_has_both() -> None:
    with pytest.raises(ConfigError, match="sft.demonstrations teach tool use, but no tools are configured"):
        load_config(None, ["sft.demonstrations=dockflow.agents.calculator:demonstration"])
    demo = load_config("configs/grpo_calculator.yaml")
    assert demo.tools.functions == ["dockflow.agents.calculator:calculator"] and demo.sft.demonstrations
    assert build_plan(demo).role("reward").reads["reward"][-1] == "tool_record"  # the reward worker reads the records
    assert "tool_record" in build_plan(demo).role("actor").writes
