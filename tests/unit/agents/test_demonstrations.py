"""Tool-use demonstrations become the trajectory the RL loop builds (``dockflow.agents.demonstrations``), so SFT
trains on model tokens under the same rule as RL; and the demo's calculator and its demonstrations."""

from __future__ import annotations

import pytest

from dockflow.agents import ToolHost, run_trajectory, tool_schema
from dockflow.agents.calculator import calculator, demonstration
from dockflow.agents.demonstrations import DemonstrationError, assistant_turn_ids, demonstration_trajectory
from dockflow.config.tools import ToolsConfig
from dockflow.flow.tool_sft import encode_trajectories
from dockflow.models.tokenizer import build_char_tokenizer, with_chat_template

PROMPT = [{"role": "user", "content": "What is 347 - 582?"}]


@pytest.fixture
def tiny():
    """The tiny model's chat tokenizer, with BPE merges (a turn's text re-encodes into merged ids)."""
    return with_chat_template(build_char_tokenizer(['{"name": "calculator", "arguments": {"a": ' * 20] * 5, 24))


def test_a_demonstration_is_the_trajectory_the_loop_builds_from_the_same_turns(tiny) -> None:
    completion = demonstration(prompt=PROMPT, answer="-235")
    traj = demonstration_trajectory(PROMPT, completion, tiny, [tool_schema(calculator)])
    # the loop itself, the model "writing" the same turns and the real calculator answering
    turns = [assistant_turn_ids(tiny, m) for m in completion if m["role"] == "assistant"]
    with ToolHost([calculator], timeout_s=5.0) as host:
        live = run_trajectory(PROMPT, lambda ids, n: turns.pop(0), tiny, host, ToolsConfig(max_total_tokens=4096))
    assert (traj.token_ids, traj.mask, traj.finish) == (live.token_ids, live.mask, "stop")
    assert traj.completion == completion  # the parsed conversation is the demonstration's
    model_text = tiny.decode([t for t, m in zip(traj.token_ids, traj.mask, strict=True) if m], skip_special_tokens=False)
    assert model_text == (
        '<tool_call>{"name": "calculator", "arguments": {"a": 347, "op": "-", "b": 582}}</tool_call><|end|>-235<|end|>'
    )
    # SFT's labels are exactly those tokens: the prompt and the tool result are never trained on
    batch = encode_trajectories([traj, traj], tiny.pad_token_id)
    labels = batch["labels"][0]
    assert tiny.decode(labels[labels >= 0]) == tiny.decode([t for t, m in zip(traj.token_ids, traj.mask, strict=True) if m])
    assert "<tool_response>" in tiny.decode(batch["input_ids"][0][labels < 0], skip_special_tokens=False)


@pytest.mark.parametrize(("completion", "message"), [
    ([{"role": "assistant", "content": "929"}, {"role": "assistant", "content": "929"}], "every assistant turn but"),
    (demonstration(prompt=PROMPT, answer="-235")[:1] + [{"role": "assistant", "content": "-235"}], "has no tool message"),
    (demonstration(prompt=PROMPT, answer="-235")[:2], "start and end with an assistant"),
    ([{"role": "user", "content": "hi"}], "not an assistant or tool message"),
])
def test_a_demonstration_that_does_not_fit_the_loop_names_why(tiny, completion, message) -> None:
    with pytest.raises(DemonstrationError, match=message):
        demonstration_trajectory(PROMPT, completion, tiny, [tool_schema(calculator)])


def test_the_calculator_checks_its_arguments_and_reads_its_problem() -> None:
    assert calculator(347, "-", 582) == -235
    for bad, message in (({"a": "347", "op": "+", "b": 1}, "a must be an integer"),
                         ({"a": 1, "op": "*", "b": 2}, "op must be"), ({"a": True, "op": "+", "b": 2}, "a must be")):
        with pytest.raises((TypeError, ValueError), match=message):
            calculator(**bad)
    with pytest.raises(ValueError, match="no 'a \\+ b'"):
        demonstration(prompt=[{"role": "user", "content": "Hello"}], answer="1")
