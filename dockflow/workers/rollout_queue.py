"""Work for the generators of one iteration, handed out on demand: a faster generator takes more chunks.

Pure logic (no Ray, no torch): with one generator it lives in that generator's process; with several, in a
small ``num_cpus=0`` Ray actor (``RemoteRolloutQueue``) that all of them draw from.

Without partial rollout the iteration's G prompts are cut into chunks of ``chunk_groups`` prompts; chunk ``k``
always holds prompts ``[k*c, (k+1)*c)`` and writes group slots ``[k*c, (k+1)*c)`` of the window, so the result
does not depend on which generator took it.

With partial rollout (``token_budget``) groups may come back unfinished: they are parked here (prompt, partial
tokens, log-probs, mask, oldest policy version, times parked) and handed out first to a later iteration.
Finished groups claim the next free slots, so each window still receives exactly G complete groups. New work
is handed out while finished + in-flight groups < G: first parked groups, then the iteration's G prompts
(budgeted), then, if parking left the iteration short, its prompts again without a budget (they finish).
A parked group whose oldest tokens would be more than ``age_bound`` versions old when trained is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dockflow.config import Config


@dataclass(eq=False)  # identity: the data is a TensorDict
class ParkedGroup:
    """An unfinished group: its prompt id, rollout tensors (a TensorDict of N rows), oldest version, age."""

    prompt_id: int
    data: Any  # TensorDict in the rollout layout + rollout_log_prob, N rows
    version: int  # the oldest policy version that produced any of its tokens
    age: int  # times parked
    parked_in: int  # the iteration whose generation parked it


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


@dataclass
class _Iteration:
    prompt_ids: list[int]
    next_prompt: int = 0
    finished: int = 0
    in_flight: int = 0
    taken_by: dict[int, int] = field(default_factory=dict)  # generator rank -> work items taken


class RolloutQueue:
    """Hands out one iteration's generation work; parks unfinished groups between iterations."""

    def __init__(self, chunk_groups: int, token_budget: int | None = None, max_age: int = 1, age_bound: int = 0):
        self.chunk = max(1, chunk_groups)
        self.budget, self.max_age, self.age_bound = token_budget, max_age, age_bound
        self.iterations: dict[int, _Iteration] = {}
        self.parked: list[ParkedGroup] = []
        self.dropped = 0

    def ready(self) -> bool:
        return True

    def open(self, iteration: int, prompt_ids: list[int]) -> None:
        """Start handing out ``iteration``'s G prompts (an iteration run again starts over)."""
        self.iterations = {i: it for i, it in self.iterations.items() if i > iteration - 8}
        self.iterations[iteration] = _Iteration(list(prompt_ids))

    def take(self, iteration: int, rank: int = 0) -> Work | None:
        """The next work item of ``iteration`` for generator ``rank``, or None when nothing is left to take."""
        it = self.iterations[iteration]
        g = len(it.prompt_ids)
        if self.budget is None:
            if it.next_prompt >= g:
                return None
            lo, hi = it.next_prompt, min(it.next_prompt + self.chunk, g)
            it.next_prompt = hi
            it.taken_by[rank] = it.taken_by.get(rank, 0) + 1
            return Work(iteration, it.prompt_ids[lo:hi], offset=lo, slot=lo)
        want = min(self.chunk, g - it.finished - it.in_flight)
        if want <= 0:
            return None
        work = Work(iteration)
        resumable = self._resumable(iteration)
        if resumable:
            final = [p for p in resumable if p.age >= self.max_age]  # these finish now: one budget per call
            work.parked = (final or resumable)[:want]
            for group in work.parked:
                self.parked.remove(group)
            work.budget = None if final else self.budget
        else:
            lo = it.next_prompt
            ids = [it.prompt_ids[(lo + k) % g] for k in range(want)]
            work.prompt_ids, work.offset = ids, lo
            work.budget = self.budget if lo < g else None  # a second pass over the prompts must finish
            it.next_prompt = lo + want
        it.in_flight += len(work.parked) or len(work.prompt_ids)
        it.taken_by[rank] = it.taken_by.get(rank, 0) + 1
        return work

    def _resumable(self, iteration: int) -> list[ParkedGroup]:
        """Parked groups a generation of ``iteration`` may continue, oldest first; drops the too-stale ones."""
        stale = [p for p in self.parked if iteration - p.version > self.age_bound]
        for p in stale:
            self.parked.remove(p)
        self.dropped += len(stale)
        return sorted((p for p in self.parked if p.parked_in < iteration), key=lambda p: (p.version, p.parked_in))

    def finish(self, iteration: int, taken: int, finished: int, parked: list[ParkedGroup]) -> int:
        """A work item of ``taken`` groups is done: ``finished`` of them are written, ``parked`` wait. Returns
        the first group slot of the window for the finished ones."""
        it = self.iterations[iteration]
        it.in_flight -= taken
        slot = it.finished
        it.finished += finished
        self.parked.extend(parked)
        return slot

    def stats(self, iteration: int) -> dict[str, Any]:
        it = self.iterations[iteration]
        return {"taken_by": dict(it.taken_by), "finished": it.finished, "parked": len(self.parked), "dropped": self.dropped}


def rollout_queue(cfg: Config) -> RolloutQueue:
    """The queue of this config: chunks of ``rollout.batch_size`` sequences; partial rollout's budget and ages.
    A parked group may be ``train.max_staleness + partial.max_age`` versions old when trained (each park can
    add one iteration), so that is the update's bound with partial rollout on."""
    return RolloutQueue(*queue_args(cfg))


def queue_args(cfg: Config) -> tuple[int, int | None, int, int]:
    """:class:`RolloutQueue`'s arguments for this config."""
    ro = cfg.rollout
    return max(1, ro.batch_size // ro.group_size), ro.partial.token_budget, ro.partial.max_age, staleness_bound(cfg)


def staleness_bound(cfg: Config) -> int:
    """Versions the oldest token of a trained sample may lag the trainer."""
    partial = cfg.rollout.partial
    return cfg.train.max_staleness + (partial.max_age if partial.token_budget is not None else 0)
