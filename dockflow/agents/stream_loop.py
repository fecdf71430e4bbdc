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


class _Driver:
    """The books of one ``stream_trajectories`` call (the same rules as ``batch_loop.drive_trajectories``)."""

    def __init__(self, steps: Sequence[Any], stream: TurnStream, stops: Collection[int], budget: int | None,
                 turns: dict[int, list[int]] | None) -> None:
        self.steps, self.stream, self.stops = steps, stream, stops
        self.done: list[Trajectory | None] = [None] * len(steps)
        self.current: dict[int, Step] = {}  # the request each live trajectory's generator waits at
        self.to_submit: set[int] = set()
        self.partial = {k: list(ids) for k, ids in (turns or {}).items()}
        self.left = [budget] * len(steps)
        self.parked: dict[int, list[int]] = {}
        self.in_engine: dict[int, int] = {}  # trajectory -> tokens it asked for
        self.advancing: dict[Future, int] = {}

    def settle(self, k: int, result: Step | Trajectory) -> None:
        if isinstance(result, Trajectory):
            self.done[k] = result
        else:
            self.current[k] = result
            self.to_submit.add(k)

    def submit(self, pool: ThreadPoolExecutor) -> None:
        """Every trajectory that asked: parked (its budget spent), submitted, or answered empty (its width spent)."""
        for k in sorted(self.to_submit):
            left = self.left[k]
            if left is not None and left <= 0:
                self.parked[k] = self.partial.pop(k, [])  # its generator waits at its yield; the caller keeps the rest
                continue
            ids, cap = self.current[k]
            turn = self.partial.get(k, [])
            want = cap - len(turn) if left is None else min(cap - len(turn), left)
            if self.stream.submit(k, ids + turn, want):
                self.in_engine[k] = want
            else:  # an empty answer, as the batch sampler gives
                self.advancing[pool.submit(_advance, self.steps, k, self.partial.pop(k, []))] = k
        self.to_submit.clear()

    def collect(self, pool: ThreadPoolExecutor) -> None:
        """One engine step: each finished turn goes back to its trajectory (in a thread: its tools run there), or,
        cut by the budget mid-turn, waits to be parked."""
        for k, got in self.stream.step():
            want = self.in_engine.pop(k)
            turn = self.partial.pop(k, []) + list(got)
            if self.left[k] is not None:
                self.left[k] -= len(got)
            ended = len(got) < want or (got and got[-1] in self.stops) or len(turn) >= self.current[k][1]
            if ended or self.left[k] is None:
                self.advancing[pool.submit(_advance, self.steps, k, turn)] = k
            else:
                self.partial[k] = turn
                self.to_submit.add(k)

    def wait_tools(self, stall_s: float) -> None:
        """The trajectories whose tool turns are back (without waiting while the engine has work)."""
        busy = self.stream.busy
        ready, _ = wait(list(self.advancing), timeout=0 if busy else stall_s, return_when=FIRST_COMPLETED)
        if not ready and not busy:
            raise TimeoutError(f"trajectories {sorted(self.advancing.values())} did not come back from their tool "
                               f"calls within {stall_s:g} s")
        for future in ready:
            self.settle(self.advancing.pop(future), future.result())


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
    books = _Driver(steps, stream, stops, budget, turns)
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tool-turn")
    try:
        for k in range(len(steps)):
            books.settle(k, _advance(steps, k, None))
        while books.to_submit or books.in_engine or books.advancing:
            books.submit(pool)
            if stream.busy:
                books.collect(pool)
            if books.advancing:
                books.wait_tools(stall_s)
    finally:
        stream.close()
        pool.shutdown(wait=True, cancel_futures=True)
    return books.done, books.parked
