from __future__ import annotations

import pytest
from trl.chat_template_utils import add_response_schema, parse_response

from dockflow.agents import parse_tool_calls
from tests.unit.agents.chat import call


def test_content_and_calls() -> None:
    turn = parse_tool_calls(
        "Let me add.\n" + call("add", '{"a": 3, "b": 4}') + "\n" + call("neg", '{"x": 1}')
    )
    assert turn.content == "Let me add."
    assert [(c.name, c.arguments) for c in turn.calls] == [("add", {"a": 3, "b": 4}), ("neg", {"x": 1})]
    assert turn.malformed == []
    assert turn.message()["tool_calls"][0] == {
        "type": "function",
        "function": {"name": "add", "arguments": {"a": 3, "b": 4}},
    }


def test_no_call_is_plain_content() -> None:
    turn = parse_tool_calls("The answer is 7.")
    assert (turn.content, turn.calls, turn.malformed) == ("The answer is 7.", [], [])
    assert "tool_calls" not in turn.message()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('<tool_call>\n{"name": "add", "arguments": {"a": 3\n</tool_call>', "not JSON"),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', 'expected {"name"'),
        ('<tool_call>\n{"name": "add", "arguments": [1, 2]}\n</tool_call>', "must be a JSON object"),
        ('<tool_call>\n{"name": "add", "arguments": {"a": 1}}', "without </tool_call>"),
    ],
)
def test_malformed_calls_are_reported_not_raised(text: str, reason: str) -> None:
    turn = parse_tool_calls(text)
    assert turn.calls == [] and len(turn.malformed) == 1 and reason in turn.malformed[0].reason


def test_string_arguments_are_decoded() -> None:
    assert parse_tool_calls(call("add", '"{\\"a\\": 1}"')).calls[0].arguments == {"a": 1}


def test_same_calls_as_trls_parse_response(tokenizer) -> None:
    """TRL's own parser (transformers' response template for Qwen2.5) reads well-formed turns the same way."""
    add_response_schema(tokenizer)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    prefix = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    for text in [
        "The answer is 7.",
        "Let me add.\n" + call("add", '{"a": 3, "b": 4}'),
        call("add", '{"a": 3, "b": 4}') + "\n" + call("sub", '{"a": 9, "b": 2}'),
    ]:
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        theirs = parse_response(tokenizer, ids, prefix=list(prefix))
        ours = parse_tool_calls(tokenizer.decode(ids, skip_special_tokens=True)).message()
        assert ours["content"] == theirs["content"]
        assert ours.get("tool_calls", []) == theirs.get("tool_calls", [])
