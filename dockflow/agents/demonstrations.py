"""Tool-use demonstrations as trajectories: the ids and per-token mask SFT trains on, built by the tool loop itself.

A demonstration is a prompt and a completion in TRL's conversational format with tool calls, as TRL's SFTTrainer
takes them::

    completion = [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"a": 347, "op": "+", "b": 582}}}]},
        {"role": "tool", "name": "calculator", "content": "929"},
        {"role": "assistant", "content": "929"},
    ]
    traj = demonstration_trajectory(prompt, completion, tokenizer, schemas, chat_template=template)
    traj.token_ids, traj.mask      # mask 1: the assistant turns' tokens (their EOS included); 0: prompt, tool turns

``run_trajectory`` builds it: a replayed ``generate`` answers each turn with the ids of the next assistant
message as the chat template renders it (``assistant_turn_ids``), and a replayed tool host answers each call
with the next tool message. So SFT trains on what an RL rollout would hold had the model written those turns,
under the same masking rule (tool tokens never trained on), and the ids are built the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from dockflow.agents.tool_host import ToolOutcome
from dockflow.agents.trajectory import Trajectory, chat_ids, run_trajectory
from dockflow.config.tools import ToolsConfig


class DemonstrationError(ValueError):
    """A demonstration does not fit the loop (its turns, calls and tool messages); the message says which."""


def assistant_turn_ids(tokenizer: Any, message: Mapping[str, Any], chat_template: str | None = None) -> list[int]:
    """The ids a model writes for the assistant ``message`` (its text and tool calls, then the EOS that ends the
    turn), as the chat template renders it after its assistant header."""
    head = [{"role": "user", "content": "dummy"}]
    render = partial(tokenizer.apply_chat_template, tokenize=True, chat_template=chat_template)
    before = chat_ids(render(head, add_generation_prompt=True))
    after = chat_ids(render([*head, dict(message)], add_generation_prompt=False))
    eos = tokenizer.eos_token_id
    turn = after[len(before) :]
    if after[: len(before)] != before or eos not in turn:
        raise DemonstrationError(
            "the chat template does not render an assistant turn as its header, the turn and the EOS token: "
            "demonstrations need a template whose turns end with the tokenizer's EOS"
        )
    return turn[: turn.index(eos) + 1]


class _Replay:
    """The tool host of a demonstration: the schemas the prompt shows, and its tool messages answered in order."""

    def __init__(self, schemas: Sequence[dict[str, Any]], answers: Sequence[Mapping[str, Any]]) -> None:
        self._schemas, self.answers = list(schemas), list(answers)

    def schemas(self) -> list[dict[str, Any]]:
        return self._schemas

    def call(self, name: str, arguments: Mapping[str, Any]) -> ToolOutcome:
        if not self.answers:
            raise DemonstrationError(f"a call of {name!r} has no tool message after it: add its result")
        answer = self.answers.pop(0)
        if answer.get("name", name) != name:
            raise DemonstrationError(f"a call of {name!r} is answered by a tool message of {answer.get('name')!r}")
        return ToolOutcome(name, str(answer["content"]))


def check_completion(completion: Any) -> str | None:
    """Why ``completion`` is not a demonstration (a list of assistant and tool messages that starts and ends with
    an assistant turn), or None."""
    if not isinstance(completion, list) or not completion:
        return "is not a non-empty list of messages"
    for i, m in enumerate(completion):
        if not isinstance(m, dict) or m.get("role") not in ("assistant", "tool"):
            return f"message {i} is not an assistant or tool message"
        if m["role"] == "tool" and "content" not in m:
            return f"tool message {i} has no 'content'"
    if completion[0]["role"] != "assistant" or completion[-1]["role"] != "assistant":
        return "must start and end with an assistant message"
    return None


def demonstration_trajectory(
    prompt: list[dict[str, Any]],
    completion: list[dict[str, Any]],
    tokenizer: Any,
    schemas: Sequence[dict[str, Any]],
    *,
    chat_template: str | None = None,
) -> Trajectory:
    """The trajectory of ``prompt`` (messages) and ``completion`` (TRL's conversational completion with tool calls
    and tool messages), with the tools' ``schemas`` in the prompt; a DemonstrationError naming what does not fit."""
    problem = check_completion(completion)
    if problem:
        raise DemonstrationError(f"the demonstration {problem}")
    turns = [assistant_turn_ids(tokenizer, m, chat_template) for m in completion if m["role"] == "assistant"]
    host = _Replay(schemas, [m for m in completion if m["role"] == "tool"])
    given = iter(turns)

    def replay(ids: list[int], budget: int) -> list[int]:
        return next(given)

    limits = ToolsConfig(max_turns=len(turns) + 1, max_tool_calls=len(completion), max_total_tokens=10**9)
    traj = run_trajectory(prompt, replay, tokenizer, host, limits, chat_template=chat_template)
    left = sum(1 for _ in given)
    if left or host.answers:
        raise DemonstrationError(
            f"the loop stopped after {traj.metrics.turns} assistant turn(s) with {left} turn(s) and "
            f"{len(host.answers)} tool message(s) left: every assistant turn but the last must call a tool, in "
            "the chat template's format, once per tool message after it"
        )
    return traj
