"""The calculator of the tool-use demo (``configs/grpo_calculator.yaml``): a tool in TRL's ``tools=`` convention,
and the demonstration SFT learns to call it from (``sft.demonstrations``).

    calculator(347, "+", 582)                                                   # 929
    demonstration(prompt=[{"role": "user", "content": "What is 347 + 582?"}], answer="929")
    # [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "calculator",
    #   "arguments": {"a": 347, "op": "+", "b": 582}}}]}, {"role": "tool", "name": "calculator", "content": "929"},
    #  {"role": "assistant", "content": "929"}]
"""

from __future__ import annotations

import re
from typing import Any

_PROBLEM = re.compile(r"(-?\d+)\s*([+-])\s*(-?\d+)")


def calculator(a: int, op: str, b: int) -> int:
    """Add or subtract two integers.

    Args:
        a: The first integer.
        op: The operator, "+" or "-".
        b: The second integer.
    """
    for name, value in (("a", a), ("b", b)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an integer, got {value!r}")
    if op not in ("+", "-"):
        raise ValueError(f"op must be '+' or '-', got {op!r}")
    return a + b if op == "+" else a - b


def demonstration(prompt: list[dict[str, Any]], answer: str, **row: Any) -> list[dict[str, Any]]:
    """The tool-use demonstration of an arithmetic row: call the calculator with the problem's operands (read from
    the last user message, "What is 347 + 582?"), then answer with what it returned."""
    found = _PROBLEM.search(prompt[-1]["content"])
    if found is None:
        raise ValueError(f"no 'a + b' or 'a - b' problem in the prompt {prompt[-1]['content']!r}")
    arguments = {"a": int(found.group(1)), "op": found.group(2), "b": int(found.group(3))}
    result = str(calculator(**arguments))
    call = {"type": "function", "function": {"name": "calculator", "arguments": arguments}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "calculator", "content": result},
        {"role": "assistant", "content": result},
    ]
