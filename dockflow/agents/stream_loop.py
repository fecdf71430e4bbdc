"""Many trajectories, each on its own: the driver ``run_rollouts`` uses over an engine's turn stream (vLLM).

    done, parked = stream_trajectories(steps, stream, stops, budget=None, turns={}, stall_s=60.0)

``drive_trajectories`` (``batch_loop``) asks for a round of turns and waits for all of them, then runs every
tool call of the round, one trajectory after another: each turn waits for the slowest trajectory and the slowest
tool. Here each trajectory goes its own pace: its turn is a request of the stream the moment it asks
(``stream.submit``), the engine is stepped while anything runs (``stream.step``), and a finished turn goes back
to its trajectory in a thread of a pool, where its tool calls run (each in the ``ToolHost`` child, under the
per-call timeout), so the engine keeps generating for the others meanwhile and the next turn joins the running
batch when its tools answered. A trajectory holds exactly what the batch driver would give it for the same
sampled ids: the generators (``trajectory_steps``) and the budget rules are the same.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Protocol, runtime_checkable

from dockflow.agents.trajectory import Step, Trajectory

@runtime_checkable
class TurnStream(Protocol):
    """An engine's turns as requests of their own (``dockflow.engines.vllm_turns.VLLMTurnStream``)."""

    busy: bool

    def submit(self, k: int, ids: list[int], budget: int) -> bool: ...

    def step(self) -> list[tuple[int, list[int]]]: ...

    def close(self) -> None: ...


def _advance(steps: Sequence[Any], k: int, value: Sequence[int] | None) -> Step | Trajectory:
    """Trajectory ``k``'s next request (it ran the tool calls of the turn it was sent), or its end."""
    try:
        return next(steps[k]) if value is None else steps[k].send(value)
    except StopIteration as stop:
        return stop.value


def stream_trajectories(
    steps: Sequence[Any],
    stream: TurnStream,
    stops: Collection[int],
    *,
    budget: int | None = None,
    turns: dict[int, list[int]] | None = None,
    stall_s: float = 60.0,
    threads: int = 16,
) -> tuple[list[Trajectory | None], dict[int, list[int]]]:
    """``drive_trajectories``' contract (finished trajectories, and the turn in progress of each one ``budget``
    parked), each trajectory advanced as soon as its own turn is back. ``stall_s``: the longest the driver waits
    for a tool turn while the engine has nothing to run (the tools' own timeouts bound it first)."""
    done: list[Trajectory | None] = [None] * len(steps)
    current: dict[int, Step] = {}  # the request each live trajectory's generator waits at
    to_submit: set[int] = set()
    partial = {k: list(ids) for k, ids in (turns or {}).items()}
    left = [budget] * len(steps)
    parked: dict[int, list[int]] = {}
    in_engine: dict[int, int] = {}  # trajectory -> tokens it asked for
    advancing: dict[Future, int] = {}
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tool-turn")

    def settle(k: int, result: Step | Trajectory) -> None:
        if isinstance(result, Trajectory):
            done[k] = result
            current.pop(k, None)
        else:
            current[k] = result
            to_submit.add(k)

    def back(k: int, turn: list[int]) -> None:  # the whole turn goes to its trajectory, in a thread
        advancing[pool.submit(_advance, steps, k, turn)] = k

    try:
        for k in range(len(steps)):
            settle(k, _advance(steps, k, None))
        while to_submit or in_engine or advancing:
            for k in sorted(to_submit):
                if left[k] is not None and left[k] <= 0:
                    parked[k] = partial.pop(k, [])  # its generator waits at its yield; the caller keeps the rest
                    continue
                ids, cap = current[k]
                turn = partial.get(k, [])
                want = cap - len(turn) if left[k] is None else min(cap - len(turn), left[k])
                if stream.submit(k, ids + turn, want):
                    in_engine[k] = want
                else:  # its response width is spent: an empty answer, as the batch sampler gives
                    back(k, partial.pop(k, []))
            to_submit.clear()
            if stream.busy:
                for k, got in stream.step():
                    want = in_engine.pop(k)
                    turn = partial.pop(k, []) + list(got)
                    if left[k] is not None:
                        left[k] -= len(got)
                    if len(got) < want or (got and got[-1] in stops) or len(turn) >= current[k][1] or left[k] is None:
                        back(k, turn)
                    else:  # the budget ran out mid-turn: parked at the next round
                        partial[k] = turn
                        to_submit.add(k)
            if advancing:
                ready, _ = wait(list(advancing), timeout=0 if stream.busy else stall_s, return_when=FIRST_COMPLETED)
                if not ready and not stream.busy:
                    raise TimeoutError(f"trajectories {sorted(advancing.values())} did not come back from their tool "
                                       f"calls within {stall_s:g} s")
                for future in ready:
                    settle(advancing.pop(future), future.result())
    finally:
        stream.close()
        pool.shutdown(wait=True, cancel_futures=True)
    return done, parked
