"""Many trajectories a turn at a time, and rollouts of dataset rows as TRL runs them (environments included).

    outs = run_rollouts(rows, generate_batch, tokenizer, [add], Counter, limits, chat_template=template)
    outs[k].trajectory, outs[k].reward, outs[k].environment, outs[k].state   # state: the instance, for environments=

``generate_batch(requests)`` takes ``[(k, ids, max_new_tokens)]``, one request per trajectory ``k`` that wants its
next turn, and returns the new ids of each, in order: one sampler call per turn for the whole batch (the
trajectories that stopped drop out), where a ``generate`` per trajectory would run the model once per row. Each
trajectory is ``trajectory_steps`` (the same loop as ``run_trajectory``), so the batch changes how the turns
are sampled, never what a trajectory holds.

Tools without an environment are stateless functions: the batch shares one ``ToolHost`` (one child process,
replaced only when a call is killed at the timeout). An environment gets one host per rollout, as TRL gives
each rollout its own instance; after ``get_reward()`` its instance is copied out of the child (``state``), so
reward functions can be passed it as ``environments=`` after the child is gone.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from dockflow.agents.environments import pick_factory, with_observation
from dockflow.agents.tools import ToolHost
from dockflow.agents.trajectory import Generate, Step, Trajectory, trajectory_steps
from dockflow.config.tools import ToolsConfig

Request = tuple[int, list[int], int]  # (trajectory index, token ids so far, max new tokens)
GenerateBatch = Callable[[list[Request]], Sequence[Sequence[int]]]


def run_trajectories(
    steps: Sequence[Generator[Step, Sequence[int], Trajectory]], generate: GenerateBatch
) -> list[Trajectory]:
    """Drive every trajectory turn by turn: each round asks ``generate`` once for the turns of all that go on."""
    done: list[Trajectory | None] = [None] * len(steps)
    pending: dict[int, Step] = {}

    def advance(k: int, value: Sequence[int] | None) -> None:
        try:
            pending[k] = next(steps[k]) if value is None else steps[k].send(value)
        except StopIteration as stop:
            done[k] = stop.value
            pending.pop(k, None)

    for k in range(len(steps)):
        advance(k, None)
    while pending:
        keys = sorted(pending)
        new = generate([(k, *pending[k]) for k in keys])
        if len(new) != len(keys):
            raise ValueError(f"generate_batch answered {len(new)} turns for {len(keys)} requests")
        for k, ids in zip(keys, new, strict=True):
            advance(k, ids)
    return [t for t in done if t is not None]


@dataclass
class Rollout:
    """A trajectory with the environment's reward (``get_reward()``; None without one), the environment's class
    name, and a copy of the instance as the rollout left it (``state``: what reward functions get as
    ``environments=``)."""

    trajectory: Trajectory
    reward: float | None
    environment: str | None
    state: Any = None


def run_rollouts(
    rows: Sequence[dict[str, Any]],
    generate: GenerateBatch,
    tokenizer: Any,
    tools: Sequence[Callable[..., Any]],
    factories: Any,
    limits: ToolsConfig,
    *,
    chat_template: str | None = None,
) -> list[Rollout]:
    """One rollout per row as TRL runs it: a fresh environment from the row's factory (``factories``: one, a dict
    picked by the row's ``environment`` column, or None), ``reset(**row)``, its observation appended to the last
    user message of ``row["prompt"]``, the tool loop (all rows a turn at a time), then ``get_reward()`` and a
    copy of the instance. ``chat_template``: ``loop_template(tokenizer)``, computed once."""
    with ExitStack() as stack:
        shared = stack.enter_context(ToolHost(tools, timeout_s=limits.timeout_s)) if factories is None else None
        hosts, steps = [], []
        for row in rows:
            factory, reset_kwargs = pick_factory(factories, row) if factories is not None else (None, {})
            host = shared or stack.enter_context(ToolHost(tools, factory, timeout_s=limits.timeout_s))
            prompt = list(row["prompt"])
            if factory is not None:
                prompt = with_observation(prompt, host.reset(reset_kwargs))
            hosts.append(host)
            steps.append(trajectory_steps(prompt, tokenizer, host, limits, chat_template=chat_template))
        trajectories = run_trajectories(steps, generate)
        return [
            Rollout(traj, host.reward(), host.environment, host.state())
            for traj, host in zip(trajectories, hosts, strict=True)
        ]


def run_rollout(
    row: dict[str, Any],
    generate: Generate,
    tokenizer: Any,
    tools: Sequence[Callable[..., Any]],
    factories: Any,
    limits: ToolsConfig,
    *,
    chat_template: str | None = None,
) -> Rollout:
    """``run_rollouts`` of one row with a per-trajectory ``generate(ids, max_new_tokens)``."""
    return run_rollouts(
        [row],
        lambda requests: [generate(ids, budget) for _, ids, budget in requests],
        tokenizer,
        tools,
        factories,
        limits,
        chat_template=chat_template,
    )[0]
