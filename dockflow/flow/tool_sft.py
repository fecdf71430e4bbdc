"""The SFT warm start of a tool run: tool-use demonstrations, trained on their model tokens only.

Each labeled row's demonstration is a completion in TRL's conversational format with tool calls (assistant turn
with ``tool_calls``, tool messages, final assistant turn): from ``sft.demonstrations`` (``module:function``,
called as ``fn(prompt=messages, answer=..., **columns)``) or else the row's own ``completion`` column. It becomes
the trajectory the RL tool loop would build had the model written those turns
(``dockflow.agents.demonstrations``), and the loss runs on the tokens of its mask: the assistant turns (their
EOS included), never the prompt or the tool results (the same rule as RL's ``response_mask``). Validation scores
the model through the tool loop with the real tools (``dockflow.eval.tool_scores``).

    demos = ToolDemonstrations(inputs, task.labeled)
    tokenizer = build_task_tokenizer(..., extra_corpus=demos.corpus())     # merges also learned from them
    trajectories = demos.trajectories(tokenizer, tool_spec(inputs.tools, tokenizer))
    batch = encode_trajectories(trajectories, tokenizer.pad_token_id)    # labels -100 off the model tokens
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dockflow.agents import ToolHost, ToolSpec, pick_factory, tool_spec, with_observation
from dockflow.agents.demonstrations import DemonstrationError, check_completion, demonstration_trajectory
from dockflow.agents.trajectory import Trajectory
from dockflow.config.tools import ToolsConfig
from dockflow.data import Example, PromptFormat
from dockflow.eval.tool_scores import tool_rows
from dockflow.user_code import import_user_callable


class DemonstrationsError(ValueError):
    """The demonstrations of a tool run's SFT are missing or malformed; the message names the row and the fix."""


class ToolDemonstrations:
    """The labeled rows of a tool run and their demonstrations (``completion`` messages), checked."""

    def __init__(self, data: Any, tools: ToolsConfig, demonstrations: str | None, examples: Sequence[Example]):
        self.tools = tools
        self.rows = tool_rows(examples, PromptFormat.of(data))
        fn = import_user_callable(demonstrations, "sft.demonstrations", DemonstrationsError) if demonstrations else None
        self.completions: list[list[dict[str, Any]]] = []
        for i, row in enumerate(self.rows):
            if fn is None and "completion" not in row:
                raise DemonstrationsError(
                    f"labeled row {i} has no 'completion' column: a tool run's SFT trains on tool-use demonstrations; "
                    "give the rows a 'completion' (TRL's conversational format) or set sft.demonstrations"
                )
            try:
                completion = fn(**row) if fn is not None else row["completion"]
            except Exception as exc:  # noqa: BLE001 - the user's function failed on this row
                raise DemonstrationsError(
                    f"sft.demonstrations {demonstrations!r} raised {type(exc).__name__} on labeled row {i}: {exc}"
                ) from None
            problem = check_completion(completion)
            if problem:
                raise DemonstrationsError(f"the demonstration of labeled row {i} {problem}")
            self.completions.append(completion)

    def corpus(self, tokenizer: Any) -> list[str]:
        """The demonstrations rendered by ``tokenizer``'s chat template with the tools' schemas (text for the
        tiny tokenizer's merges: a tool run's prompts and calls are mostly this text)."""
        spec = tool_spec(self.tools, None)
        out = []
        for row, completion in zip(self.rows, self.completions, strict=True):
            prompt, schemas = _prompt(spec, row)
            out.append(tokenizer.apply_chat_template([*prompt, *completion], tools=schemas, tokenize=False))
        return out

    def trajectories(self, tokenizer: Any, spec: ToolSpec) -> list[Trajectory]:
        """Each demonstration as the tool loop builds it (ids and per-token mask)."""
        out = []
        for i, (row, completion) in enumerate(zip(self.rows, self.completions, strict=True)):
            prompt, schemas = _prompt(spec, row)
            try:
                out.append(
                    demonstration_trajectory(prompt, completion, tokenizer, schemas, chat_template=spec.chat_template)
                )
            except DemonstrationError as exc:
                raise DemonstrationsError(f"the demonstration of labeled row {i}: {exc}") from None
        return out


def _prompt(spec: ToolSpec, row: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The row's prompt as a rollout shows it (with an environment: ``reset(**row)``'s observation appended) and
    the schemas it renders: the tools, then the environment's methods."""
    if spec.factories is None:
        return row["prompt"], ToolHost(spec.tools).schemas()  # no child process starts for the schemas
    factory, reset_kwargs = pick_factory(spec.factories, row)
    with ToolHost(spec.tools, factory, timeout_s=spec.limits.timeout_s) as host:
        return with_observation(row["prompt"], host.reset(reset_kwargs)), host.schemas()


def encode_trajectories(trajectories: Sequence[Trajectory], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask``/``labels``: labels are the ids on model tokens (mask 1),
    -100 on the prompt, the tool turns and padding."""
    width = max(len(t.token_ids) for t in trajectories)
    ids = torch.full((len(trajectories), width), pad_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    attention = torch.zeros_like(ids)
    for k, t in enumerate(trajectories):
        n = len(t.token_ids)
        ids[k, :n] = torch.tensor(t.token_ids)
        attention[k, :n] = 1
        labels[k, :n] = torch.where(torch.tensor(t.mask).bool(), ids[k, :n], -100)
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}
