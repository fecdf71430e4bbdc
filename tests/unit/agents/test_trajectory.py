from __future__ import annotations

import pytest
from trl.chat_template_utils import qwen3_chat_template

from dockflow.agents import ToolHost, loop_template, run_trajectory, tool_suffix_ids
from dockflow.config.tools import ToolsConfig
from dockflow.models.tokenizer import build_char_tokenizer
from tests.unit.agents.chat import call, qwen_style, scripted
from tests.unit.agents.tools_for_tests import add, divide, wait

PROMPT = [{"role": "user", "content": "What is 3 + 4, then divided by 0?"}]
LIMITS = ToolsConfig(max_turns=4, max_tool_calls=8, max_total_tokens=4096, timeout_s=5.0)


def _run(tokenizer, turns, limits=LIMITS, tools=(add, divide)):
    generate, emitted = scripted(tokenizer, turns)
    with ToolHost(list(tools), timeout_s=limits.timeout_s) as host:
        return run_trajectory(PROMPT, generate, tokenizer, host, limits), emitted


def test_the_mask_marks_exactly_the_model_tokens(tokenizer) -> None:
    turns = [
        call("add", '{"a": 3, "b": 4}'),
        "Now divide.\n" + call("divide", '{"a": 7, "b": 0}'),
        "It is 7.",
    ]
    traj, emitted = _run(tokenizer, turns)
    assert traj.finish == "stop" and traj.metrics.turns == 3
    ids, mask = traj.token_ids, traj.mask
    assert len(ids) == len(mask) and mask[: traj.prompt_length] == [0] * traj.prompt_length
    # the masked-in tokens are the generated ids, verbatim and in order; nothing else is
    assert [t for t, m in zip(ids, mask, strict=True) if m] == [t for turn in emitted for t in turn]
    runs = []  # the contiguous stretches of model tokens are exactly the turns
    for i, m in enumerate(mask):
        if m and (i == 0 or not mask[i - 1]):
            runs.append([])
        if m:
            runs[-1].append(ids[i])
    assert runs == emitted
    # and the whole trajectory is what the template renders for the conversation (Qwen2.5 re-renders earlier
    # turns identically when the model wrote the calls in the template's own format)
    rendered = tokenizer.apply_chat_template(traj.messages, tools=[add, divide], tokenize=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == rendered.removesuffix("\n")
    tool_text = tokenizer.decode(
        [t for t, m in zip(ids[traj.prompt_length :], mask[traj.prompt_length :], strict=True) if not m]
    )
    assert "<tool_response>\n7\n</tool_response>" in tool_text
    assert "{'error': 'division by zero'}" in tool_text
    m = traj.metrics
    assert (m.tool_calls, m.tool_errors, m.timeouts) == (2, 1, 0)
    assert m.model_tokens == sum(mask) and m.tool_tokens == len(ids) - traj.prompt_length - sum(mask)
    assert 0.0 < m.tool_token_share < 1.0


def test_generated_ids_are_kept_even_when_retokenizing_would_merge_them() -> None:
    """With BPE merges, the text of a turn re-encodes to other ids than the sampler's (here: one id per
    character); the trajectory keeps the sampled ids, which is why it is built incrementally."""
    tok = qwen_style(
        build_char_tokenizer(["the answer is seven " * 50, "tool_call arguments name " * 50], 60)
    )
    text = "the answer is seven"
    chars = [tok.convert_tokens_to_ids(c) for c in text] + [tok.eos_token_id]
    assert tok.encode(text, add_special_tokens=False) != chars[:-1]

    with ToolHost([add], timeout_s=5.0) as host:
        traj = run_trajectory(PROMPT, lambda ids, n: chars, tok, host, LIMITS)
    assert traj.token_ids[traj.prompt_length :] == chars and traj.mask[traj.prompt_length :] == [1] * len(
        chars
    )


def test_a_malformed_call_and_an_unknown_tool_answer_with_error_turns(tokenizer) -> None:
    turns = [
        '<tool_call>\n{"name": "add", "arguments": {"a": 3,}\n</tool_call>',
        call("multiply", '{"a": 3}'),
        "7",
    ]
    traj, _ = _run(tokenizer, turns)
    assert traj.finish == "stop"
    tool_turns = [m for m in traj.messages if m["role"] == "tool"]
    assert [t["name"] for t in tool_turns] == ["invalid_tool_call", "multiply"]
    assert "malformed tool call: not JSON" in tool_turns[0]["content"]
    assert tool_turns[1]["content"] == "{'error': 'Tool multiply not found.'}"
    assert (traj.metrics.tool_calls, traj.metrics.tool_errors) == (2, 2)


def test_max_turns_ends_without_running_the_last_turns_calls(tokenizer) -> None:
    limits = LIMITS.model_copy(update={"max_turns": 2})
    traj, emitted = _run(tokenizer, [call("add", '{"a": 1, "b": 1}')] * 5, limits)
    assert traj.finish == "max_turns" and traj.metrics.turns == 2 and len(emitted) == 2
    assert traj.metrics.tool_calls == 1 and traj.mask[-1] == 1  # it ends on the model's turn


def test_max_tool_calls(tokenizer) -> None:
    limits = LIMITS.model_copy(update={"max_tool_calls": 2})
    two = call("add", '{"a": 1, "b": 1}') + "\n" + call("add", '{"a": 2, "b": 2}')
    traj, _ = _run(tokenizer, [two, two, "done"], limits)
    assert traj.finish == "max_tool_calls" and traj.metrics.tool_calls == 2 and traj.metrics.turns == 2


@pytest.mark.parametrize(("room", "turns"), [(10, 2), (0, 1)])
def test_max_total_tokens_cuts_the_turn_and_never_overflows(tokenizer, room: int, turns: int) -> None:
    """Room for the call, its result and ``room`` more tokens: the next turn is cut there; with no room
    left after the result, the result is not appended and the trajectory ends on the model's call."""
    first = call("add", '{"a": 1, "b": 1}')
    prompt = len(
        tokenizer.apply_chat_template(PROMPT, tools=[add, divide], add_generation_prompt=True)["input_ids"]
    )
    turn = len(tokenizer.encode(first, add_special_tokens=False)) + 1
    suffix = len(tool_suffix_ids(tokenizer, [{"role": "tool", "name": "add", "content": "2"}]))
    limits = LIMITS.model_copy(update={"max_total_tokens": prompt + turn + suffix + room})
    traj, _ = _run(tokenizer, [first, "x" * 200], limits)
    assert traj.finish == "max_total_tokens" and traj.metrics.turns == turns
    assert len(traj.token_ids) == (prompt + turn + suffix + room if room else prompt + turn)


def test_a_hanging_tool_is_counted_as_a_timeout(tokenizer) -> None:
    limits = LIMITS.model_copy(update={"timeout_s": 0.3})
    traj, _ = _run(tokenizer, [call("wait", '{"seconds": 30}'), "gave up"], limits, tools=(wait,))
    assert traj.finish == "stop"
    assert (traj.metrics.tool_calls, traj.metrics.tool_errors, traj.metrics.timeouts) == (1, 1, 1)
    assert "timed out after 0.3 s" in traj.messages[-2]["content"]


def test_qwen3_runs_with_trls_prefix_preserving_template() -> None:
    """Qwen3's template writes an empty <think></think> into the last assistant turn only, so tool turns cannot
    be appended to it; the loop renders with TRL's prefix-preserving version (as TRL's trainer does)."""
    tok = qwen_style(build_char_tokenizer())
    tok.chat_template = qwen3_chat_template
    with pytest.raises(ValueError, match="loop_template"):
        tool_suffix_ids(tok, [{"role": "tool", "name": "add", "content": "7"}])
    template = loop_template(tok)
    assert template is not None and loop_template(qwen_style(build_char_tokenizer())) is None  # Qwen2.5: own
    turns = [
        "<think>\nI need the tool.\n</think>\n\n" + call("add", '{"a": 3, "b": 4}'),
        "<think>\nOK\n</think>\n\n7",
    ]
    generate, emitted = scripted(tok, turns)
    with ToolHost([add], timeout_s=5.0) as host:
        traj = run_trajectory(PROMPT, generate, tok, host, LIMITS, chat_template=template)
    assert traj.finish == "stop" and traj.metrics.tool_calls == 1 and traj.messages[2]["content"] == "7"
    assert [t for t, m in zip(traj.token_ids, traj.mask, strict=True) if m] == [t for e in emitted for t in e]
    rendered = tok.apply_chat_template(traj.messages, tools=[add], tokenize=False, chat_template=template)
    assert tok.decode(traj.token_ids, skip_special_tokens=False) == rendered.removesuffix("\n")
