"""The stage loops: the scheduler that runs every stage of every iteration as soon as its gate opens.

One scheduler for both drivers: ``dockflow train`` runs it in its own process, a pipeline run in the run's
supervisor actor on the Ray cluster (``dockflow.flow.supervisor``). What the stages are, their order, their gates
and what each sends to the workers is written in one place, phase by phase: ``dockflow.flow.iteration``. This
module only runs them: each stage has its own cursor over the iterations, and stage ``S`` of iteration ``i``
starts as soon as ``tasks.waits_for(S, i, progress)`` is empty.

A stage's work is a generator: it yields ``{name: ObjectRef}``, receives the results, and ``return``s its metrics
(Python hands a generator's return value over as ``StopIteration.value``: ``StageLoops._step`` reads it there), so
that the sampling rounds of the run plan (DAPO's dynamic sampling) are one generate task. When the stages of
iteration ``i`` are done, the iteration closes (``tasks.close``: metrics, MLflow, progress; its seconds leave out
the held-out evaluations done meanwhile, ``EVAL_SECONDS``, as verl and TRL time evaluation apart) and a due
checkpoint is written (``tasks.checkpoint``). Every running task has a deadline (``train.stage_timeout_s``); a
failure stops every loop and raises ``StageError`` naming the stage, the iteration and the cause.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

from dockflow.flow.waiting import StageError, stage_error

STAGES = ("generate", "infer", "update", "reshard", "evaluate")
AWAIT_ONLY = "@"  # a ref named "@..." is waited for but not fetched (e.g. published weights): its result is the ref
Refs = dict[str, Any]
StageTask = Generator[Refs, dict[str, Any], dict[str, float]]
EVAL_SECONDS = "timing/eval_s"  # an evaluate task's own seconds, as the evaluating worker measured them
LOOP_TICK_S = 0.5  # longest wait between checks of the stop flag and the deadlines


class RunStopped(RuntimeError):
    """The loops were asked to stop (a run that is torn down, abandoned or restarted)."""


class Waiter(Protocol):
    """How the loops wait for refs: Ray's, or a fake one in tests."""

    def ready(self, refs: list[Any], timeout_s: float) -> list[Any]: ...

    def get(self, ref: Any) -> Any: ...


class RayWaiter:
    def ready(self, refs: list[Any], timeout_s: float) -> list[Any]:
        """The refs that are done, after waiting up to ``timeout_s`` for the first (values stay remote)."""
        import ray

        first, _ = ray.wait(refs, num_returns=1, timeout=timeout_s, fetch_local=False)
        if not first:
            return []
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        return done

    def get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref)


class Tasks(Protocol):
    """What the loops run: each stage's gate and its work per iteration, the close of an iteration, checkpoints
    (``dockflow.flow.iteration.RunTasks``)."""

    def waits_for(self, stage: str, index: int, progress: Progress) -> list[str]: ...

    def stage(self, stage: str, index: int) -> StageTask: ...

    def checkpoint(self, step: int) -> StageTask: ...

    def close(self, iteration: int, results: dict[str, dict[str, float]], seconds: float) -> None: ...


@dataclass
class Schedule:
    """Which iterations the loops run and where they start."""

    start: int  # first iteration to run (a resumed run: its checkpoint's step)
    end: int  # iterations in all (exclusive)
    max_staleness: int
    eval_steps: list[int]  # steps whose policy is evaluated (0: before RL), ascending, all >= start
    checkpoint_steps: set[int]  # steps after which a checkpoint is written
    generated: dict[int, dict[str, float]] = field(default_factory=dict)  # restored in-flight generations
    in_rounds: bool = False  # the run plan's sampling is in rounds, scored by generate: infer(i) waits for all of it
    publish_first: bool = False  # disaggregated: reshard(start - 1) publishes the restored policy first


@dataclass
class Progress:
    """What the loops have sent and finished, by stage (and ``checkpoint``): what the gates read."""

    schedule: Schedule
    sent: dict[str, set[int]]
    done: dict[str, set[int]]

    def eval_due(self, step: int) -> bool:
        return step in self.schedule.eval_steps

    def checkpoint_due(self, step: int) -> bool:
        return step in self.schedule.checkpoint_steps


@dataclass
class _Running:
    kind: str  # a stage, or "checkpoint"
    index: int
    coro: StageTask
    refs: Refs
    deadline: float
    started: float
    checked: set[str] = field(default_factory=set)  # refs already done and fetched without error


class StageLoops:
    """Runs ``schedule`` to its end; ``on_stage`` hears of every stage task done, ``on_complete`` of every stage
    that has done all its iterations."""

    def __init__(self, schedule: Schedule, tasks: Tasks, timeout_s: float, waiter: Waiter | None = None,
                 on_stage: Callable[[str, int, dict[str, float], float], None] | None = None,
                 on_complete: Callable[[str], None] | None = None, stop: threading.Event | None = None) -> None:
        self.schedule, self.tasks, self.timeout_s = schedule, tasks, timeout_s
        self.waiter = waiter or RayWaiter()
        self.on_stage, self.on_complete = on_stage, on_complete
        self.stop = stop or threading.Event()
        start = schedule.start
        self.sent: dict[str, set[int]] = {s: set() for s in (*STAGES, "checkpoint")}
        self.done: dict[str, set[int]] = {s: set() for s in (*STAGES, "checkpoint")}
        self.progress = Progress(schedule, self.sent, self.done)
        self.results: dict[tuple[str, int], dict[str, float]] = {}
        self.next = {s: start for s in STAGES}
        self.next["evaluate"] = 0  # an index into schedule.eval_steps
        self.next["generate"] = start + len(schedule.generated)
        for j, metrics in schedule.generated.items():
            self.sent["generate"].add(j)
            self._mark("generate", j, metrics)
        self.done["reshard"].add(start - 1)  # the policy the run starts from
        self.sent["reshard"].add(start - 1)
        if schedule.publish_first:
            self.done["reshard"].discard(start - 1)
        self.done["checkpoint"].add(start)  # what the run starts from (a checkpoint, or nothing to save)
        self.closed = start  # the next iteration to close
        self.last_close = time.monotonic()
        self.evaluating_s = 0.0  # seconds the evaluations done since the last close took (not the iteration's)
        self.running: list[_Running] = []
        self.ready: set[Any] = set()  # refs known done, of tasks still waiting for others
        self.completed: set[str] = set()

    # ---- the loop ----

    def run(self) -> None:
        """Run every stage to the end; raises StageError on a failure, RunStopped when asked to stop."""
        if self.schedule.publish_first:
            self._launch("reshard", self.schedule.start - 1)
        while not self._finished():
            if self.stop.is_set():
                raise RunStopped("the run's stage loops were asked to stop")
            self._launch_ready()
            if self._finished():
                break
            if not self.running:
                blocked = {s: self._waits_for(s) for s in STAGES if not self._stage_ended(s)}
                raise StageError(f"the stage loops cannot go on (a bug): waiting for {blocked}")
            self._advance()
        self._report_complete()

    def _waits_for(self, stage: str) -> list[str]:
        return self.tasks.waits_for(stage, self._cursor_index(stage), self.progress)

    def _cursor_index(self, stage: str) -> int:
        return self.schedule.eval_steps[self.next[stage]] if stage == "evaluate" else self.next[stage]

    def _stage_ended(self, stage: str) -> bool:
        if stage == "evaluate":
            return self.next[stage] >= len(self.schedule.eval_steps)
        return self.next[stage] >= self.schedule.end

    def _finished(self) -> bool:
        return self.closed >= self.schedule.end and not self.running and all(self._stage_ended(s) for s in STAGES)

    def _launch_ready(self) -> None:
        progress = True
        while progress:
            progress = False
            for stage in STAGES:
                if not self._stage_ended(stage) and not self._waits_for(stage):
                    index = self._cursor_index(stage)
                    self.next[stage] += 1
                    self._launch(stage, index)
                    progress = True
            progress |= self._close_ready()
        self._report_complete()

    def _close_ready(self) -> bool:
        """Close the next iteration when its stages are done; then start its checkpoint if one is due."""
        i = self.closed
        if i >= self.schedule.end or any(i not in self.done[s] for s in ("generate", "infer", "update", "reshard")):
            return False
        if self.progress.eval_due(i + 1) and i + 1 not in self.done["evaluate"]:
            return False
        if i + 1 in self.schedule.checkpoint_steps and i + 1 not in self.sent["checkpoint"]:
            # in-flight generations must be done: the checkpoint holds their samples
            ahead = range(i + 1, min(i + 1 + self.schedule.max_staleness, self.schedule.end))
            if any(j not in self.done["generate"] for j in ahead):
                return False
        now = time.monotonic()
        # popped: a closed iteration's metrics are never read again (kept, they grew the driver by each iteration's)
        parts = {s: self.results.pop((s, i), {}) for s in ("generate", "infer", "update", "reshard")}
        if self.progress.eval_due(i + 1):
            parts["evaluate"] = self.results.pop(("evaluate", i + 1))
        self.tasks.close(i, parts, max(now - self.last_close - self.evaluating_s, 0.0))
        self.last_close, self.evaluating_s = now, 0.0
        self.closed = i + 1
        if i + 1 in self.schedule.checkpoint_steps:
            self._launch("checkpoint", i + 1)
        return True

    def _launch(self, kind: str, index: int) -> None:
        coro = self.tasks.checkpoint(index) if kind == "checkpoint" else self.tasks.stage(kind, index)
        now = time.monotonic()
        self.sent[kind].add(index)
        task = _Running(kind, index, coro, {}, now + self.timeout_s, now)
        self._step(task, None)

    def _step(self, task: _Running, results: dict[str, Any] | None) -> None:
        """Send ``results`` into the task: it asks for more refs, or finishes."""
        try:
            refs = task.coro.send(results)
        except StopIteration as stop:
            if task in self.running:
                self.running.remove(task)
            self._mark(task.kind, task.index, stop.value or {}, time.monotonic() - task.started)
            return
        except StageError:
            raise
        except Exception as exc:  # noqa: BLE001 - a task's own failure (or a dead dock process), named with its stage
            raise stage_error(exc, task.kind, task.index) from exc
        task.refs = refs
        task.deadline = time.monotonic() + self.timeout_s
        if task not in self.running:
            self.running.append(task)

    def _mark(self, kind: str, index: int, metrics: dict[str, float], seconds: float = 0.0) -> None:
        self.done[kind].add(index)
        if kind != "checkpoint":  # what close reads; a checkpoint's metrics go nowhere
            self.results[(kind, index)] = metrics
        if kind == "evaluate":
            self.evaluating_s += metrics.get(EVAL_SECONDS, 0.0)
        if self.on_stage is not None and kind in STAGES:
            self.on_stage(kind, index, metrics, seconds)

    def _advance(self) -> None:
        """Wait (briefly) for refs not known done yet; step every task whose refs are all done; enforce the
        deadlines."""
        pending = [r for t in self.running for r in t.refs.values() if r not in self.ready]
        now = time.monotonic()
        wait = max(0.0, min([LOOP_TICK_S, *(t.deadline - now for t in self.running)]))
        if pending:
            self.ready.update(self.waiter.ready(pending, wait))
        for task in list(self.running):
            if all(r in self.ready for r in task.refs.values()):
                self.ready.difference_update(task.refs.values())
                task.checked.clear()
                self._step(task, {name: self._get(task, name, ref) for name, ref in task.refs.items()})
                continue
            for name, ref in task.refs.items():  # a failed part fails the task now, not when its siblings end
                if ref in self.ready and name not in task.checked:
                    self._get(task, name, ref)
                    task.checked.add(name)
            if time.monotonic() > task.deadline:
                waiting = sorted(n for n, r in task.refs.items() if r not in self.ready)
                raise StageError(f"iteration {task.index}: stage '{task.kind}' ({', '.join(waiting)}) did not finish "
                                 f"within {self.timeout_s:.0f}s (train.stage_timeout_s)")

    def _get(self, task: _Running, name: str, ref: Any) -> Any:
        if name.startswith(AWAIT_ONLY):
            return ref
        try:
            return self.waiter.get(ref)
        except Exception as exc:  # noqa: BLE001 - Ray's errors, translated
            raise stage_error(exc, name, task.index) from None

    def _report_complete(self) -> None:
        for stage in STAGES:
            if stage in self.completed or not self._stage_ended(stage):
                continue
            if any(t.kind == stage for t in self.running):
                continue
            self.completed.add(stage)
            if self.on_complete is not None:
                self.on_complete(stage)
