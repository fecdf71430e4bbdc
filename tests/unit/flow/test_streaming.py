"""The stage loops' order, records and failures, with fake actors (``fake_ray``): what one worker sees is the
order the old synchronous loop sent (so runs stay reproducible), evaluations and checkpoints sit between the
iterations they belong to, and a failure or a missed deadline names the stage and the iteration."""

import random
import threading
import time

import pytest
from fake_ray import FakeActor, World

from dockflow.flow.iteration import waits_for
from dockflow.flow.stage_loops import EVAL_SECONDS, RunStopped, Schedule, StageLoops
from dockflow.flow.waiting import StageError


class Recorder:
    def __init__(self, log: list) -> None:
        self.log = log

    def run(self, kind: str, index: int) -> dict[str, float]:
        self.log.append((kind, index))
        return {f"{kind}/done": float(index)}


class ActorTasks:
    """Every stage of a colocated run on one actor (as the policy worker is); ``fail`` raises in one task."""

    def __init__(self, world: World, fail: tuple[str, int] | None = None) -> None:
        self.calls: list = []
        self.closed: list = []
        self.actor = FakeActor(world, Recorder(self.calls))
        self.fail = fail

    waits_for = staticmethod(waits_for)  # the run's gates

    def stage(self, stage: str, index: int):
        results = yield {stage: self.actor.run.remote(stage, index)}
        if (stage, index) == self.fail:
            raise ValueError("boom")
        return results[stage]

    def checkpoint(self, step: int):
        yield {"save": self.actor.run.remote("checkpoint", step)}
        return {}

    def close(self, i: int, parts: dict, seconds: float) -> None:
        self.closed.append((i, sorted(parts)))


def test_one_worker_sees_the_synchronous_order_with_evaluations_and_checkpoints_between_iterations():
    tasks = ActorTasks(World(random.Random(0)))
    schedule = Schedule(start=0, end=4, max_staleness=0, eval_steps=[0, 2, 4], checkpoint_steps={2, 4})
    completed = []
    StageLoops(schedule, tasks, 60.0, waiter=tasks.actor._world, on_complete=completed.append).run()
    order = [f"{k[0]}{i}" for k, i in tasks.calls]
    assert " ".join(order) == ("e0 g0 i0 u0 r0 g1 i1 u1 r1 e2 c2 g2 i2 u2 r2 g3 i3 u3 r3 e4 c4")
    assert [i for i, _ in tasks.closed] == [0, 1, 2, 3]
    assert tasks.closed[1][1] == ["evaluate", "generate", "infer", "reshard", "update"]  # step 2's evaluation
    assert sorted(completed) == ["evaluate", "generate", "infer", "reshard", "update"]


def test_a_closed_iteration_s_stage_results_are_let_go():
    """The loops keep a stage's metrics only until its iteration closes: a long run's driver does not grow by
    every iteration's (benchmarks/soak.py found it)."""
    tasks = ActorTasks(World(random.Random(2)))
    schedule = Schedule(start=0, end=40, max_staleness=1, eval_steps=[0, 20, 40], checkpoint_steps={20, 40})
    loops = StageLoops(schedule, tasks, 60.0, waiter=tasks.actor._world)
    loops.run()
    assert [i for i, _ in tasks.closed] == list(range(40))
    assert tasks.closed[19][1] == ["evaluate", "generate", "infer", "reshard", "update"]
    assert list(loops.results) == [("evaluate", 0)]  # the evaluation before RL, logged when it is done


def test_a_resumed_run_starts_at_its_checkpoint_with_what_was_generated_ahead():
    tasks = ActorTasks(World(random.Random(1)))
    schedule = Schedule(start=2, end=4, max_staleness=1, eval_steps=[4], checkpoint_steps={4},
                        generated={2: {"rollout/samples": 8.0}})
    StageLoops(schedule, tasks, 60.0, waiter=tasks.actor._world).run()
    assert ("generate", 2) not in tasks.calls and ("generate", 3) in tasks.calls  # 2 came from the checkpoint
    assert [i for i, _ in tasks.closed] == [2, 3]


def test_a_failing_stage_stops_the_loops_and_names_the_stage_and_iteration():
    tasks = ActorTasks(World(random.Random(2)), fail=("update", 1))
    schedule = Schedule(start=0, end=4, max_staleness=0, eval_steps=[], checkpoint_steps=set())
    with pytest.raises(StageError, match=r"iteration 1: stage 'update' failed: ValueError: boom$"):
        StageLoops(schedule, tasks, 60.0, waiter=tasks.actor._world).run()
    assert [i for i, _ in tasks.closed] == [0]


class NeverReady:
    def ready(self, refs, timeout_s):
        time.sleep(min(timeout_s, 0.05))
        return []

    def get(self, ref):
        raise AssertionError("nothing is ever ready")


def test_a_stage_past_its_deadline_fails_naming_what_it_waited_for():
    tasks = ActorTasks(World(random.Random(3)))
    schedule = Schedule(start=0, end=1, max_staleness=0, eval_steps=[], checkpoint_steps=set())
    with pytest.raises(StageError, match=r"iteration 0: stage 'generate' \(generate\) did not finish within 0s"):
        StageLoops(schedule, tasks, 0.2, waiter=NeverReady()).run()


def test_the_loops_stop_when_asked():
    tasks = ActorTasks(World(random.Random(4)))
    stop = threading.Event()
    stop.set()
    with pytest.raises(RunStopped):
        StageLoops(Schedule(0, 2, 0, [], set()), tasks, 60.0, waiter=NeverReady(), stop=stop).run()


class SlowEvaluations(ActorTasks):
    """Evaluations take ``EVAL_S`` of wall time and report it as the actor does (``EVAL_SECONDS``)."""

    EVAL_S = 0.6

    def stage(self, stage: str, index: int):
        results = yield {stage: self.actor.run.remote(stage, index)}
        if stage != "evaluate":
            return results[stage]
        time.sleep(self.EVAL_S)
        return {**results[stage], EVAL_SECONDS: self.EVAL_S}

    def close(self, i: int, parts: dict, seconds: float) -> None:
        self.closed.append((i, seconds))


def test_an_iteration_s_seconds_leave_out_the_evaluations_done_meanwhile():
    tasks = SlowEvaluations(World(random.Random(4)))
    schedule = Schedule(start=0, end=3, max_staleness=0, eval_steps=[0, 2], checkpoint_steps=set())
    start = time.monotonic()
    StageLoops(schedule, tasks, 60.0, waiter=tasks.actor._world).run()
    wall = time.monotonic() - start
    assert wall >= 2 * SlowEvaluations.EVAL_S  # both evaluations ran in the loops' wall time
    assert [i for i, _ in tasks.closed] == [0, 1, 2]
    # iteration 0 closes after evaluation 0, iteration 1 with evaluation 2: neither counts their seconds
    assert all(seconds < SlowEvaluations.EVAL_S / 2 for _, seconds in tasks.closed), tasks.closed
