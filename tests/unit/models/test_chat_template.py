"""The tiny tokenizer's chat template with tools (``dockflow.models.chat_template``), checked with TRL's own
checks and with the tool loop's parser."""

from __future__ import annotations

from pathlib import Path

from trl.chat_template_utils import (
    is_chat_template_prefix_preserving,
    is_chat_template_stop_token_trained,
    supports_tool_calling,
)

from dockflow.agents import parse_tool_calls, tool_schema, tool_suffix_ids
from dockflow.agents.calculator import calculator
from dockflow.models import load_tokenizer
from dockflow.models.tokenizer import build_char_tokenizer, with_chat_template

CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"a": 347, "op": "+", "b": 582}}}
CONVERSATION = [
    {"role": "user", "content": "What is 347 + 582?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "name": "calculator", "content": "929"},
    {"role": "assistant", "content": "929"},
]
# The template before tools, for conversations without them (whose rendering must not move).
ROLE_TOKENS_ONLY = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_trls_checks_pass_tools_calls_prefix_and_the_stop_token() -> None:
    tok = with_chat_template(build_char_tokenizer())
    assert supports_tool_calling(tok)
    assert is_chat_template_prefix_preserving(tok)  # what the tool loop's suffix ids rely on
    assert is_chat_template_stop_token_trained(tok)  # the assistant mask ends on <|end|>, the EOS
    assert tok.eos_token == "<|end|>"


def test_tools_calls_and_results_render_compactly_and_parse_back() -> None:
    tok = with_chat_template(build_char_tokenizer())
    text = tok.apply_chat_template(CONVERSATION, tools=[tool_schema(calculator)], tokenize=False)
    assert text == (
        "<|system|><tools>calculator(a: integer, op: string, b: integer): Add or subtract two integers.</tools><|end|>"
        "<|user|>What is 347 + 582?<|end|>"
        '<|assistant|><tool_call>{"name": "calculator", "arguments": {"a": 347, "op": "+", "b": 582}}</tool_call><|end|>'
        "<|user|><tool_response>929</tool_response><|end|><|assistant|>929<|end|>"
    )
    turn = text.split("<|assistant|>")[1].removesuffix("<|end|><|user|><tool_response>929</tool_response><|end|>")
    assert parse_tool_calls(turn).calls[0].message() == CALL
    # what the loop appends after a turn that called two tools: one user turn with both results
    results = [{"role": "tool", "name": "calculator", "content": c} for c in ("1", "2")]
    suffix = tok.decode(tool_suffix_ids(tok, results), skip_special_tokens=False)
    assert suffix == "<|user|><tool_response>1</tool_response><tool_response>2</tool_response><|end|><|assistant|>"


def test_conversations_without_tools_render_as_before_and_optional_parameters_are_marked(tmp_path: Path) -> None:
    tok = with_chat_template(build_char_tokenizer())
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "2 + 2?"}]
    for gen in (False, True):
        old = tok.apply_chat_template(plain, tokenize=False, add_generation_prompt=gen, chat_template=ROLE_TOKENS_ONLY)
        assert tok.apply_chat_template(plain, tokenize=False, add_generation_prompt=gen) == old

    def search(query: str, limit: int = 3) -> str:
        """Search the notes.

        Args:
            query: What to look for.
            limit: How many notes.
        """
        return query

    text = tok.apply_chat_template(plain[:2], tools=[tool_schema(search)], tokenize=False)
    assert text.startswith("<|system|>Be brief.\n<tools>search(query: string, limit?: integer): Search the notes.</tools>")
    tok.save_pretrained(tmp_path)  # and it travels with the model directory
    loaded = load_tokenizer(tmp_path)
    assert loaded.apply_chat_template(plain[:2], tools=[tool_schema(search)], tokenize=False) == text
    assert loaded.eos_token == "<|end|>" and len(loaded.encode("<tool_call>", add_special_tokens=False)) == 1
