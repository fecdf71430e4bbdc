"""Many trajectories a turn at a time, and rollouts of dataset rows as TRL runs them (environments included); the
``ToolSpec`` they run with (``tool_spec``: the ``tools:`` section imported).

    outs = run_rollouts(rows, generate_batch, tokenizer, [add], Counter, limits, chat_template=template)
    outs[k].trajectory, outs[k].reward, outs[k].environment, outs[k].state   # state: the instance, for environments=

``generate_batch(requests)`` takes ``[(k, ids, max_new_tokens)]``, one request per trajectory ``k`` that wants its
next turn, and returns the new ids of each, in order: one sampler call per turn for the whole batch (the
trajectories that stopped drop out), where a ``generate`` per trajectory would run the model once per row
(over a generation engine: ``dockflow.engines.turn_sampler.BatchSampler``). Each
trajectory is ``trajectory_steps`` (the same loop as ``run_trajectory``), so the batch changes how the turns
are sampled, never what a trajectory holds.

Tools without an environment are stateless functions: the batch shares a ``ToolHostPool`` (one child process
while calls come one at a time, as here; more when trajectories call side by side, ``stream_loop``; a child is
replaced when a call is killed at the timeout). An environment gets one host per rollout, as TRL gives
each rollout its own instance; after ``get_reward()`` its instance is copied out of the child (``state``), so
reward functions can be passed it as ``environments=`` after the child is gone.

Partial rollout: with ``budget=T`` each rollout gets at most T model tokens in this call, over as many turns as
they reach (tool tokens do not count); one that has not finished then is returned as a ``ParkedTrajectory``
(``dockflow.agents.parking``), mid-turn or between turns, and passing it back in a later call (among new rows or
alone) goes on in that turn. A turn split over calls is the turn the loop sees once it ends: its ids are only
parsed for calls when complete, so a trajectory is the same however the budget cut it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from dockflow.agents.environments import pick_factory, with_observation
from dockflow.agents.parking import ParkedTrajectory, resumed_host
from dockflow.agents.stream_loop import TurnStream, stream_trajectories
from dockflow.agents.tool_host import ToolHost, ToolHostPool, import_tool
from dockflow.agents.trajectory import (
    Generate,
    Step,
    Trajectory,
    loop_template,
    open_trajectory,
    trajectory_steps,
)
from dockflow.config.tools import ToolsConfig

Request = tuple[int, list[int], int]  # (trajectory index, token ids so far, max new tokens)
GenerateBatch = Callable[[list[Request]], Sequence[Sequence[int]]]
Steps = Generator[Step, Sequence[int], Trajectory]


@dataclass(frozen=True)
class ToolSpec:
    """What the tool loop needs besides the engine: the tools, the environment factories, the limits and the
    chat template it renders with (``loop_template``)."""

    tools: Sequence[Callable[..., Any]]
    factories: Any
    limits: ToolsConfig
    chat_template: str | None = None


def tool_spec(tc: ToolsConfig, tokenizer: Any) -> ToolSpec:
    """The ``tools:`` section's tools and environment factories imported (a ToolError naming a path that does not
    import), and the chat template the loop renders with for ``tokenizer`` (None: the tools only)."""
    factories: Any = None
    if tc.environment:
        factories = import_tool(tc.environment)
    elif tc.environments:
        factories = {name: import_tool(path) for name, path in tc.environments.items()}
    template = loop_template(tokenizer) if tokenizer is not None else None
    return ToolSpec([import_tool(p) for p in tc.functions], factories, tc, template)


def drive_trajectories(
    steps: Sequence[Steps],
    generate: GenerateBatch,
    stops: Collection[int],
    *,
    budget: int | None = None,
    turns: dict[int, list[int]] | None = None,
) -> tuple[list[Trajectory | None], dict[int, list[int]]]:
    """Drive every trajectory turn by turn, each round asking ``generate`` once for the turns of all that go on,
    under a token budget: each trajectory gets at most ``budget`` model tokens (None: no limit); ``turns[k]``: ids
    trajectory ``k`` already has of the turn it asks for (a parked turn going on). Returns the finished trajectories (None where one stopped) and, for each one the budget stopped, the ids of
    its turn in progress ([] between turns). A turn is complete when it ends with a stop id (``stops``), reaches
    the loop's limit, or the sampler gives fewer tokens than asked (it stopped at EOS or the response width)."""
    done: list[Trajectory | None] = [None] * len(steps)
    pending: dict[int, Step] = {}
    partial = {k: list(ids) for k, ids in (turns or {}).items()}
    left = [budget] * len(steps)
    parked: dict[int, list[int]] = {}

    def advance(k: int, value: Sequence[int] | None) -> None:
        try:
            pending[k] = next(steps[k]) if value is None else steps[k].send(value)
        except StopIteration as stop:
            done[k] = stop.value
            pending.pop(k, None)

    for k in range(len(steps)):
        advance(k, None)
    while pending:
        for k in [k for k in pending if left[k] is not None and left[k] <= 0]:
            parked[k] = partial.pop(k, [])  # its generator is left waiting at its yield; the caller keeps the rest
            del pending[k]
        requests = []
        for k in sorted(pending):
            ids, cap = pending[k]
            turn = partial.get(k, [])
            room = cap - len(turn)
            requests.append((k, ids + turn, room if left[k] is None else min(room, left[k])))
        if not requests:
            break
        new = generate(requests)
        if len(new) != len(requests):
            raise ValueError(f"generate_batch answered {len(new)} turns for {len(requests)} requests")
        for (k, _, want), got in zip(requests, new, strict=True):
            got = list(got)[:want]
            turn = partial.pop(k, []) + got
            if left[k] is not None:
                left[k] -= len(got)
            if len(got) < want or (got and got[-1] in stops) or len(turn) >= pending[k][1] or left[k] is None:
                advance(k, turn)
            else:  # the budget ran out mid-turn
                partial[k] = turn
    return done, parked


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
    rows: Sequence[dict[str, Any] | ParkedTrajectory],
    generate: GenerateBatch | TurnStream,
    tokenizer: Any,
    tools: Sequence[Callable[..., Any]],
    factories: Any,
    limits: ToolsConfig,
    *,
    chat_template: str | None = None,
    budget: int | None = None,
) -> list[Any]:
    """One rollout per row as TRL runs it: a fresh environment from the row's factory (``factories``: one, a dict
    picked by the row's ``environment`` column, or None), ``reset(**row)``, its observation appended to the last
    user message of ``row["prompt"]``, the tool loop (over a ``GenerateBatch``: all rows a turn at a time; over a
    ``TurnStream``: each row at its own pace, ``stream_loop``), then ``get_reward()`` and a copy of the instance:
    a ``Rollout``. ``chat_template``: ``loop_template(tokenizer)``, computed once.

    ``budget``: model tokens per rollout in this call (partial rollout; None: to the end); a rollout it stops is
    a ``ParkedTrajectory`` instead, its environment pickled out of its child. A ``ParkedTrajectory`` among
    ``rows`` goes on where it stopped (no ``reset``: its environment comes back from the pickle)."""
    stops = [tokenizer.eos_token_id]
    with ExitStack() as stack:
        shared = stack.enter_context(ToolHostPool(tools, limits.timeout_s)) if factories is None else None
        hosts, trajs, steps, turns, keys = [], [], [], {}, []
        for k, row in enumerate(rows):
            if isinstance(row, ParkedTrajectory):
                host = shared or stack.enter_context(resumed_host(row, tools, factories, limits.timeout_s))
                traj, turns[k], key = row.trajectory, list(row.turn), row.factory
            else:
                factory, reset_kwargs = pick_factory(factories, row) if factories is not None else (None, {})
                host = shared or stack.enter_context(ToolHost(tools, factory, timeout_s=limits.timeout_s))
                prompt = list(row["prompt"])
                if factory is not None:
                    prompt = with_observation(prompt, host.reset(reset_kwargs))
                traj = open_trajectory(prompt, tokenizer, host, chat_template)
                key = row.get("environment") if isinstance(factories, Mapping) else None
            hosts.append(host)
            trajs.append(traj)
            keys.append(key)
            steps.append(trajectory_steps([], tokenizer, host, limits, chat_template=chat_template, start=traj))
        if isinstance(generate, TurnStream):  # each trajectory at its own pace (vLLM)
            stall_s = limits.timeout_s * max(limits.max_tool_calls, 1) + 30.0
            done, parked = stream_trajectories(steps, generate, stops, budget=budget, turns=turns, stall_s=stall_s)
        else:  # a round of turns at a time (HF)
            done, parked = drive_trajectories(steps, generate, stops, budget=budget, turns=turns)
        return [
            Rollout(traj, host.reward(), host.environment, host.state())
            if k not in parked
            else ParkedTrajectory(traj, parked[k], host.environment, keys[k], host.snapshot(), host.lost)
            for k, (traj, host) in enumerate(zip(trajs, hosts, strict=True))
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
