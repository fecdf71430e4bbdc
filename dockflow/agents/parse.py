"""Tool calls parsed from a model turn in the Hermes/Qwen format that Qwen2.5 and Qwen3 chat templates render:

    I will add them.
    <tool_call>
    {"name": "add", "arguments": {"a": 3, "b": 4}}
    </tool_call>

A call that cannot be read (bad JSON, no name, arguments that are not an object, an unclosed tag) is reported
in ``ParsedTurn.malformed``, never raised: the loop answers it with an error turn. TRL's ``parse_response``
instead falls back to plain text (the rollout ends); a turn it parses, this parses the same (tested).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any]

    def message(self) -> dict[str, Any]:
        """The call as a chat message's ``tool_calls`` entry (TRL's and transformers' form)."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Malformed:
    """A call block that could not be read: the name where one was readable, and why."""

    name: str | None
    reason: str


@dataclass(frozen=True)
class ParsedTurn:
    """A model turn: its text before the first call, its calls, and the blocks that could not be read."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    malformed: list[Malformed] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        """The turn as an assistant message (``tool_calls`` only when it has calls)."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.calls:
            out["tool_calls"] = [c.message() for c in self.calls]
        return out


def _one(body: str) -> ToolCall | Malformed:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return Malformed(None, f"not JSON ({exc.msg} at char {exc.pos})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return Malformed(None, 'expected {"name": <function-name>, "arguments": <args-json-object>}')
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return Malformed(obj["name"], "arguments are a string that is not a JSON object")
    if not isinstance(args, dict):
        return Malformed(obj["name"], "arguments must be a JSON object")
    return ToolCall(obj["name"], args)


def parse_tool_calls(text: str) -> ParsedTurn:
    """The content and tool calls of one decoded model turn (special tokens already dropped)."""
    start = text.find(OPEN)
    if start < 0:
        return ParsedTurn(text.strip())
    calls: list[ToolCall] = []
    malformed: list[Malformed] = []
    end = start
    for match in _BLOCK.finditer(text, start):
        parsed = _one(match.group(1))
        (calls if isinstance(parsed, ToolCall) else malformed).append(parsed)
        end = match.end()
    if text.find(OPEN, end) >= 0:
        malformed.append(Malformed(None, f"{OPEN} without {CLOSE}"))
    return ParsedTurn(text[:start].strip(), calls, malformed)
