"""How wide a tool trajectory's prompt is, measured before the run generates: every train row rendered as the tool
loop renders it (``open_trajectory``: the chat template with the schema of every tool and environment method, and
the observation an environment's ``reset`` returns for the row appended), so the dock's prompt column holds the
longest, and a prompt that cannot fit the model is refused at start with the sizes.

    width = tool_prompt_width(rows, tokenizer, spec, max_new_tokens=32, context=1024)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from typing import Any

from dockflow.agents.batch_loop import ToolSpec
from dockflow.agents.environments import pick_factory, with_observation
from dockflow.agents.tool_host import ToolHost, ToolHostPool
from dockflow.agents.trajectory import open_trajectory


class ToolPromptError(ValueError):
    """A tool prompt does not fit the trajectory or the model; the message gives the sizes and the setting."""


def tool_prompt_lengths(rows: Sequence[Mapping[str, Any]], tokenizer: Any, spec: ToolSpec) -> list[int]:
    """Tokens of each row's prompt as the loop renders it. An environment is reset once per row in one child per
    factory (TRL, too, resets one instance for row after row); its observation counts."""
    out = []
    with ExitStack() as stack:
        shared = stack.enter_context(ToolHostPool(spec.tools, spec.limits.timeout_s)) if spec.factories is None else None
        hosts: dict[int, ToolHost] = {}
        for row in rows:
            messages = list(row["prompt"])
            host: Any = shared
            if shared is None:
                factory, reset_kwargs = pick_factory(spec.factories, row)
                if id(factory) not in hosts:
                    hosts[id(factory)] = stack.enter_context(ToolHost(spec.tools, factory, spec.limits.timeout_s))
                host = hosts[id(factory)]
                messages = with_observation(messages, host.reset(reset_kwargs))
            out.append(open_trajectory(messages, tokenizer, host, spec.chat_template).prompt_length)
    return out


def tool_prompt_width(
    rows: Sequence[Mapping[str, Any]], tokenizer: Any, spec: ToolSpec, *, max_new_tokens: int, context: int | None
) -> int:
    """The longest row's rendered prompt, checked: it leaves room for a reply within ``tools.max_total_tokens``,
    and with ``rollout.max_new_tokens`` it fits the model's ``context`` (None: not checked)."""
    if not rows:
        raise ToolPromptError("the tool loop has no train rows to measure")
    lengths = tool_prompt_lengths(rows, tokenizer, spec)
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    width = lengths[longest]
    what = (f"train row {longest}'s tool prompt renders to {width} tokens (the schemas of "
            f"{len(spec.limits.paths)} tool or environment path(s){' and the observation reset returns' if spec.factories else ''} included)")
    total = spec.limits.max_total_tokens
    if width >= total:
        raise ToolPromptError(f"{what}, which leaves no room for a reply within tools.max_total_tokens={total}: raise "
                              f"it to at least {width + max_new_tokens} (that prompt plus rollout.max_new_tokens)")
    if context is not None and width + max_new_tokens > context:
        raise ToolPromptError(f"{what}; with rollout.max_new_tokens={max_new_tokens} it needs {width + max_new_tokens} "
                              f"positions, over the model's context of {context} (max_position_embeddings): shorten the "
                              "tools' docstrings or the observation, or lower rollout.max_new_tokens")
    return width
