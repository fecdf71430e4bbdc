"""Work for the generators of one iteration, handed out on demand: a faster generator takes more chunks.

Pure logic (no torch; Ray only in ``QueueClient``, imported when it calls an actor): with one generator it lives
in that generator's process; with several, in a small ``num_cpus=0`` Ray actor (``ray.remote(RolloutQueue)``,
named ``<run>-rollout-queue``) that all of them draw from, each through a ``QueueClient``.

Without partial rollout the iteration's G prompts are cut into chunks of ``chunk_groups`` prompts; chunk ``k``
always holds prompts ``[k*c, (k+1)*c)`` and writes group slots ``[k*c, (k+1)*c)`` of the window, so the result
does not depend on which generator took it.

With partial rollout (``token_budget``) generation is a stream, over-provisioned as in APRIL: groups that do
not finish within the budget are parked here (prompt, partial tokens, log-probs, mask, oldest policy version,
times parked) and continued first by a later iteration; finished groups claim the next free slots, so each
window receives exactly G complete groups, and finished groups beyond G wait, ready, for the next window. An
iteration's work, in order:

1. parked groups of earlier iterations: ready ones, then the ones parked ``max_age`` times (they finish now),
   then the others (budgeted), packed so that a work item has at most ``rows_per_chunk`` unfinished rows;
2. G new prompts from the prompt stream (this iteration's, then the next one's), budgeted, even when the
   window is already full, as long as most new groups so far parked: they keep the parked pool primed for
   the next iteration (when most finish within the budget, they would only wait a version for the next window);
   while the window is short, a work item starts no more new prompts than should fill it at the rate new groups
   have finished within the budget so far;
3. while the window is short: up to ``over_provision`` x G more new prompts (budgeted), then this iteration's
   own parked groups without a budget (they finish), then its prompts again without a budget.

In steady state an iteration finishes the groups the previous one parked (only their unfinished rows are
decoded) and starts G new ones, so no decode step waits for a long tail longer than the budget twice.
A parked group whose oldest tokens would be more than ``age_bound`` versions old when trained is dropped, or
with ``on_stale: regenerate`` its prompt goes back to the head of the stream and starts over.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from dockflow.algos.plan import RunPlan
    from dockflow.config import Config


@dataclass(eq=False)  # identity: the data is a TensorDict or a list of trajectories
class ParkedGroup:
    """A group waiting in the queue: prompt id, its N rollouts so far (the generator's ``GroupSampler`` data),
    oldest version, age, and how many of its rows are unfinished (0: the group is finished and waits for a window
    slot)."""

    prompt_id: int
    data: Any  # single-turn: a TensorDict of N rows (rollout layout + rollout_log_prob); tools: N trajectories
    version: int  # the oldest policy version that produced any of its tokens
    age: int  # times parked
    parked_in: int  # the iteration whose generation parked it
    open_rows: int = 1  # rows still generating


@dataclass
class Work:
    """One unit of generation: new prompts (``prompt_ids``, from ``offset`` of the iteration's list), or parked
    groups to continue. ``slot``: the first group slot to write (fixed chunks), None = claim on finishing."""

    iteration: int
    prompt_ids: list[int] = field(default_factory=list)
    offset: int = 0
    slot: int | None = None
    parked: list[ParkedGroup] = field(default_factory=list)
    budget: int | None = None  # new tokens per response in this call; None = finish


@dataclass(frozen=True)
class QueueSettings:
    """A :class:`RolloutQueue`'s settings (``queue_settings(cfg, plan)``); without ``token_budget``: fixed chunks only."""

    chunk_groups: int  # prompts per work item
    token_budget: int | None = None  # partial rollout: new tokens per response per work item
    max_age: int = 1  # parks after which a group runs to the end
    age_bound: int = 0  # versions a parked group's oldest token may lag when trained (older: stale)
    over_provision: float = 0.0  # extra new prompts (x G) started while the window is short
    next_prompts: Callable[[int], list[int]] | None = None  # look-ahead: an iteration's prompt ids
    rows_per_chunk: int = 0  # unfinished rows per work item of parked groups (0: chunk_groups)
    on_stale: str = "drop"  # or "regenerate": a stale group's prompt starts over

    def __post_init__(self) -> None:
        if self.on_stale not in ("drop", "regenerate"):
            raise ValueError(f"on_stale={self.on_stale!r}: choose drop or regenerate")


@dataclass
class FinishedWork:
    """What a generator reports back for one work item of ``taken`` groups: ``finished`` of them are complete,
    ``parked`` wait; ``budget``: it ran under the token budget; ``new``: it started new prompts."""

    iteration: int
    taken: int
    finished: int
    parked: list[ParkedGroup] = field(default_factory=list)
    budget: bool = False
    new: bool = False


class Grant(NamedTuple):
    """The window's answer to finished groups: the first slot they write, and how many of them it takes."""

    slot: int
    granted: int


@dataclass
class _Iteration:
    prompt_ids: list[int]
    next_prompt: int = 0  # fixed chunks: the next prompt to hand out; partial: of the no-budget last resort
    finished: int = 0
    in_flight: int = 0  # groups handed out that will finish (all of them without partial rollout)
    started: int = 0  # partial: new prompts started from the stream
    taken_by: dict[int, int] = field(default_factory=dict)  # generator rank -> work items taken


class RolloutQueue:
    """Hands out one iteration's generation work; parks unfinished groups between iterations."""

    def __init__(self, settings: QueueSettings) -> None:
        self.chunk = max(1, settings.chunk_groups)
        self.budget, self.max_age, self.age_bound = settings.token_budget, settings.max_age, settings.age_bound
        self.over_provision, self.next_prompts = settings.over_provision, settings.next_prompts
        self.rows_per_chunk = settings.rows_per_chunk or self.chunk
        self.on_stale = settings.on_stale
        self.iterations: dict[int, _Iteration] = {}
        self.parked: list[ParkedGroup] = []
        self.stream: deque[int] = deque()  # partial: prompts not started yet, in iteration order
        self.streamed: set[int] = set()  # iterations whose prompts joined the stream
        self.dropped = self.regenerated = self.overflow = 0
        self.new_started = self.new_finished = 0  # new groups under the budget so far, and those that finished

    def ready(self) -> bool:
        return True

    def open(self, iteration: int, prompt_ids: list[int]) -> None:
        """Start handing out ``iteration``'s G prompts (an iteration run again starts over; with partial rollout
        its prompts join the stream once, with the next iteration's as look-ahead)."""
        self.iterations = {i: it for i, it in self.iterations.items() if i > iteration - 8}
        self.iterations[iteration] = _Iteration(list(prompt_ids))
        if self.budget is not None:
            self._stream(iteration, prompt_ids)
            if self.next_prompts is not None:
                self._stream(iteration + 1, self.next_prompts(iteration + 1))

    def _stream(self, iteration: int, prompt_ids: list[int]) -> None:
        if iteration not in self.streamed:
            self.streamed.add(iteration)
            self.stream.extend(prompt_ids)

    def take(self, iteration: int, rank: int = 0) -> Work | None:
        """The next work item of ``iteration`` for generator ``rank``, or None when nothing is left to take."""
        it = self.iterations[iteration]
        work = self._next_fixed(it, iteration) if self.budget is None else self._next_partial(it, iteration)
        if work is not None:
            it.taken_by[rank] = it.taken_by.get(rank, 0) + 1
        return work

    def _next_fixed(self, it: _Iteration, iteration: int) -> Work | None:
        g = len(it.prompt_ids)
        if it.next_prompt >= g:
            return None
        lo, hi = it.next_prompt, min(it.next_prompt + self.chunk, g)
        it.next_prompt = hi
        return Work(iteration, it.prompt_ids[lo:hi], offset=lo, slot=lo)

    def _next_partial(self, it: _Iteration, iteration: int) -> Work | None:
        g = len(it.prompt_ids)
        short = it.finished + it.in_flight < g
        resumable = self._resumable(iteration) if short else []
        if resumable:
            return self._resume(it, iteration, resumable)
        primes = it.started < g and (short or self._budget_parks_most())
        if primes or (short and it.started < g * (1 + self.over_provision)):
            size = min(self.chunk, self._expected_to_fill(g - it.finished - it.in_flight)) if short else self.chunk
            ids = [self.stream.popleft() for _ in range(min(size, len(self.stream)))]
            if ids:
                it.started += len(ids)
                return Work(iteration, ids, budget=self.budget)
        if not short:
            return None
        own = [p for p in self.parked if p.parked_in == iteration]
        if own:
            return self._resume(it, iteration, own, finish=True)
        if it.in_flight > 0:
            return None  # what is in flight may still fill the window
        # Nothing parked and the stream is dry: the iteration's prompts again, run to the end.
        want = g - it.finished
        ids = [it.prompt_ids[(it.next_prompt + k) % g] for k in range(min(self.chunk, want))]
        it.next_prompt += len(ids)
        it.in_flight += len(ids)
        return Work(iteration, ids)

    def _resume(self, it: _Iteration, iteration: int, groups: list[ParkedGroup], finish: bool = False) -> Work:
        """Parked groups of one kind (finishing now, or budgeted), packed up to ``rows_per_chunk`` open rows; of
        those finishing now, no more than the window still needs."""
        final = finish or groups[0].age >= self.max_age or groups[0].open_rows == 0
        kind = [p for p in groups if finish or (p.age >= self.max_age or p.open_rows == 0) == final]
        if final:  # these all finish: no more than the window still needs
            kind = kind[: len(it.prompt_ids) - it.finished - it.in_flight]
        taken: list[ParkedGroup] = []
        rows = 0
        for p in kind:
            if taken and rows + p.open_rows > self.rows_per_chunk:
                break
            taken.append(p)
            rows += p.open_rows
        for p in taken:
            self.parked.remove(p)
        if final:
            it.in_flight += len(taken)
        return Work(iteration, parked=taken, budget=None if final else self.budget)

    def _resumable(self, iteration: int) -> list[ParkedGroup]:
        """Parked groups of earlier, filled iterations that a generation of ``iteration`` may continue: ready first,
        then the ones that must finish, oldest first. The too-stale ones are dropped, or with ``on_stale:
        regenerate`` their prompts go back to the head of the stream."""
        stale = [p for p in self.parked if iteration - p.version > self.age_bound]
        for p in stale:
            self.parked.remove(p)
        if self.on_stale == "regenerate":  # the prompt starts over, first in the stream, with the current weights
            self.stream.extendleft(reversed([p.prompt_id for p in stale]))
            self.regenerated += len(stale)
        else:
            self.dropped += len(stale)
        return sorted((p for p in self.parked if p.parked_in < iteration and self._filled(p.parked_in)),
                      key=lambda p: (p.open_rows > 0, p.age < self.max_age, p.version, p.parked_in))

    def _filled(self, iteration: int) -> bool:
        """Whether ``iteration``'s window is full: until then its parked groups are its own to finish (a later
        iteration, generating at the same time under max_staleness >= 1, must not take them)."""
        it = self.iterations.get(iteration)
        return it is None or it.finished >= len(it.prompt_ids)

    def _expected_to_fill(self, missing: int) -> int:
        """New groups to start so that about ``missing`` finish within the budget, at the rate seen so far."""
        rate = self.new_finished / self.new_started if self.new_started else 1.0
        return max(1, math.ceil(missing / max(rate, 1e-3)))

    def _budget_parks_most(self) -> bool:
        """Whether most new groups so far parked under the budget (none seen yet counts as yes). Only then are
        new prompts started once the window is full: when most finish within the budget they would only wait,
        a version older, for the next window."""
        return 2 * self.new_finished <= self.new_started

    def finish(self, done: FinishedWork) -> Grant:
        """A work item is done: park its unfinished groups and grant window slots to its complete ones; the
        caller parks those the window does not take with :meth:`park` (ready for the next window)."""
        it = self.iterations[done.iteration]
        if not done.budget:
            it.in_flight -= done.taken
        elif done.new:
            self.new_started += done.taken
            self.new_finished += done.finished
        slot = it.finished
        granted = min(done.finished, len(it.prompt_ids) - it.finished)
        it.finished += granted
        self.parked.extend(done.parked)
        return Grant(slot, granted)

    def park(self, groups: list[ParkedGroup]) -> None:
        """Finished groups the window had no slot for: the next window takes them first."""
        self.overflow += len(groups)
        self.parked.extend(groups)

    # What a checkpoint holds: everything but the look-ahead function (the run's prompt sampler, rebuilt alike).
    _STATE = ("iterations", "parked", "stream", "streamed", "dropped", "regenerated", "overflow", "new_started",
              "new_finished")

    def state_dict(self) -> dict[str, Any]:
        """The queue's state (parked groups with their tokens, the prompt stream, counters) for a checkpoint."""
        return {name: getattr(self, name) for name in self._STATE}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self._STATE:
            setattr(self, name, state[name])

    def stats(self, iteration: int) -> dict[str, Any]:
        it = self.iterations[iteration]
        waiting = [p for p in self.parked if p.open_rows > 0]
        return {"taken_by": dict(it.taken_by), "finished": it.finished, "parked": len(waiting),
                "ready": len(self.parked) - len(waiting), "started": it.started, "dropped": self.dropped,
                "regenerated": self.regenerated, "overflow": self.overflow}


def checkpoint_types() -> tuple[type, ...]:
    """The classes a checkpoint's in-flight part holds (the queue's state: parked groups, their trajectories with
    tools); its reader rebuilds these and refuses any other (``dockflow.storage.part_format``)."""
    from dockflow.agents.parking import ParkedTrajectory
    from dockflow.agents.trajectory import Trajectory, TrajectoryMetrics
    from dockflow.rollout.multi_turn import Finished, Sampled

    return (ParkedGroup, _Iteration, Sampled, Finished, ParkedTrajectory, Trajectory, TrajectoryMetrics)


class RolloutQueueTimeout(RuntimeError):
    """The generators' shared rollout queue did not answer in time."""


class QueueClient:
    """A :class:`RolloutQueue` in this process, or its Ray actor (several generators), called alike; an actor that
    does not answer within ``timeout_s`` (``train.stage_timeout_s``) raises :class:`RolloutQueueTimeout`."""

    def __init__(self, queue: Any, timeout_s: float = 60.0) -> None:
        self.queue, self.timeout_s = queue, timeout_s

    def take(self, iteration: int, rank: int) -> Work | None:
        return self._call(self.queue.take, iteration, rank, iteration=iteration)

    def finish(self, done: FinishedWork) -> Grant:
        return Grant(*self._call(self.queue.finish, done, iteration=done.iteration))

    def park(self, groups: list[ParkedGroup]) -> None:
        self._call(self.queue.park, groups)

    def stats(self, iteration: int) -> dict[str, Any]:
        return self._call(self.queue.stats, iteration, iteration=iteration)

    def state_dict(self) -> dict[str, Any]:
        return self._call(self.queue.state_dict)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._call(self.queue.load_state_dict, state)

    def _call(self, method: Callable[..., Any] | Any, *args: Any, iteration: int | None = None) -> Any:
        """``method(*args)`` on the local queue, or ``method.remote(*args)`` on the actor, waited for."""
        if not hasattr(method, "remote"):
            return method(*args)
        import ray

        try:
            return ray.get(method.remote(*args), timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            name = getattr(method, "_method_name", "a call")  # Ray's ActorMethod keeps its method's name there
            which = "" if iteration is None else f" for iteration {iteration}"
            raise RolloutQueueTimeout(
                f"the rollout queue actor did not answer '{name}'{which} within {self.timeout_s:.0f}s "
                "(train.stage_timeout_s); is the '<run>-rollout-queue' actor alive?"
            ) from None


def rollout_queue(cfg: Config, plan: RunPlan, excluded: Sequence[int] = ()) -> RolloutQueue:
    """The queue of this config: chunks of ``rollout.batch_size`` sequences; partial rollout's budget and ages.
    A parked group may be ``train.max_staleness + partial.max_age`` versions old when trained (each park can
    add one iteration), so that is the update's bound with partial rollout on."""
    return RolloutQueue(queue_settings(cfg, plan, excluded))


def queue_settings(cfg: Config, plan: RunPlan, excluded: Sequence[int] = ()) -> QueueSettings:
    """:class:`RolloutQueue`'s settings for this config and run ``plan`` (the prompt sampler as look-ahead with partial rollout; the
    train prompts ``excluded`` by the length policy left out)."""
    from dockflow.rollout.prompts import iteration_sampler  # lazily: the queue actor stays light

    ro, partial = cfg.rollout, cfg.rollout.partial
    chunk = max(1, ro.batch_size // ro.group_size)
    if partial.token_budget is None:
        return QueueSettings(chunk)
    return QueueSettings(
        chunk, token_budget=partial.token_budget, max_age=partial.max_age, age_bound=staleness_bound(cfg),
        over_provision=partial.over_provision, next_prompts=iteration_sampler(cfg, plan, excluded).indices,
        rows_per_chunk=ro.batch_size, on_stale=partial.on_stale,
    )


def staleness_bound(cfg: Config) -> int:
    """Versions the oldest token of a trained sample may lag the trainer."""
    partial = cfg.rollout.partial
    return cfg.train.max_staleness + (partial.max_age if partial.token_budget is not None else 0)
