"""Where a run stops restarting: ``fault_tolerance.max_restarts`` used up ends the run with one line that says so,
in the CLI driver's session, in the pipeline's supervisor and in the task a KFP retry runs; a dead dock process
is a death a restart may help, like a dead worker. (The run killed for real: integration/test_fault_tolerance.py.)"""

from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from ray.exceptions import RayTaskError

from dockflow.dock.errors import DockUnavailable
from dockflow.flow import pipeline_tasks, session
from dockflow.flow.run_record import RunRecord
from dockflow.flow.session import RunSession
from dockflow.flow.supervisor import RunSupervisor
from dockflow.flow.waiting import StageError, out_of_restarts, stage_error

DIED = ("iteration 2: the worker running stage 'infer' died: The actor died unexpectedly before finishing this task.\n"
        "\tclass_name: RewardWorker")
LINE = "fault_tolerance.max_restarts=2 reached, the run stops: " + DIED.replace("\n\t", " ")


def ft(restart: bool, max_restarts: int) -> SimpleNamespace:
    return SimpleNamespace(fault_tolerance=SimpleNamespace(restart=restart, max_restarts=max_restarts),
                           train=SimpleNamespace(stage_timeout_s=1.0, iterations=4))


def dying_session(monkeypatch: pytest.MonkeyPatch, cfg: SimpleNamespace, error: StageError) -> RunSession:
    """A session whose stage loops always fail with ``error``; a restart only counts."""

    class Loops:
        def __init__(self, *_a: Any, **_kw: Any) -> None:
            pass

        def run(self) -> None:
            raise error

    monkeypatch.setattr(session, "StageLoops", Loops)
    monkeypatch.setattr(session, "RunTasks", lambda *_a: SimpleNamespace(generated={}))
    run = object.__new__(RunSession)
    run.cfg, run.state, run.schedule = cfg, RunRecord(), SimpleNamespace(start=0, generated={})
    monkeypatch.setattr(run, "parts", lambda: None)
    monkeypatch.setattr(run, "restart", lambda _reason: setattr(run.state, "restarts", run.state.restarts + 1))
    return run


def test_the_session_restarts_max_restarts_times_then_stops_with_one_line(monkeypatch):
    run = dying_session(monkeypatch, ft(True, 2), StageError(DIED, worker_died=True))
    with pytest.raises(StageError) as info:
        run.run()
    assert run.state.restarts == 2
    assert str(info.value) == LINE + (". Its latest checkpoint stays: rerun with --resume (a pipeline run: resubmit it "
                                      "with the same run_name), or raise fault_tolerance.max_restarts")


@pytest.mark.parametrize(("restart", "died"), [(False, True), (True, False)], ids=["restart off", "not a death"])
def test_without_restart_or_a_death_the_stage_error_stays_as_it_was(monkeypatch, restart: bool, died: bool):
    error = StageError(DIED, worker_died=died)
    run = dying_session(monkeypatch, ft(restart, 2), error)
    with pytest.raises(StageError) as info:
        run.run()
    assert info.value is error and run.state.restarts == 0


def test_a_dead_dock_process_under_a_stage_is_a_death_a_restart_may_help():
    gone = DockUnavailable("get(reward): the dock actor is dead or unreachable (ActorDiedError: ...)")
    assert stage_error(RayTaskError("compute_rewards", "Traceback ...", gone), "infer", 2).worker_died
    assert stage_error(gone, "generate", 2).worker_died  # the driver's own dock call (the window's reset)
    assert not stage_error(ValueError("x"), "generate", 2).worker_died


def supervisor(restarts: int) -> RunSupervisor:
    """A failed pipeline run's supervisor (its state only) that has restarted ``restarts`` times."""
    sup = object.__new__(RunSupervisor)
    sup.cfg, sup.lock, sup.attached_at = ft(False, 2), threading.Condition(), 0.0
    sup.phase, sup.epoch, sup.error = "failed", 0, f"StageError: {DIED}"
    sup.session = SimpleNamespace(state=SimpleNamespace(restarts=restarts, iteration=2))
    sup.tracker = SimpleNamespace(run_id="r", experiment_id="e", tracking_uri="sqlite:///x")
    sup.store = SimpleNamespace(location=lambda: "ckpt")
    return sup


def test_a_supervisor_out_of_restarts_refuses_with_one_line_once():
    sup = supervisor(restarts=2)
    first = sup.restart(0)
    assert first["phase"] == "failed"
    assert first["error"].startswith("fault_tolerance.max_restarts=2 reached, the run stops: StageError: iteration 2: ")
    assert "\n" not in first["error"]
    assert sup.restart(0)["error"] == first["error"]  # every retried task fails with the same line
    assert out_of_restarts(first["error"], 2) == first["error"]


class Handle:
    """A supervisor handle whose ``restart`` is answered by ``_get`` (patched) like its ``follow``."""

    def __init__(self) -> None:
        self.follow = SimpleNamespace(remote=lambda *_a: None)
        self.restart = SimpleNamespace(remote=lambda *_a: None)


def test_a_retried_pipeline_task_out_of_restarts_fails_with_the_line(monkeypatch):
    line = out_of_restarts(f"StageError: {DIED}", 2)
    answers = iter([{"events": [], "cursor": 0, "complete": False, "phase": "failed", "epoch": 0, "iterations": 4,
                     "error": f"StageError: {DIED}"},
                    {"events": [], "cursor": 0, "complete": False, "phase": "failed", "epoch": 0, "iterations": 4,
                     "error": line}])
    monkeypatch.setattr(pipeline_tasks, "_joined", lambda *_a: contextlib.nullcontext())
    monkeypatch.setattr(pipeline_tasks, "_supervisor", lambda *_a, **_kw: Handle())
    monkeypatch.setattr(pipeline_tasks, "_get", lambda *_a: next(answers))
    with pytest.raises(StageError) as info:
        pipeline_tasks.follow_stage("infer", "ns", "run", None)
    assert str(info.value) == f"run 'run', stage infer: {line}"
