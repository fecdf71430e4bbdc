"""A stage task whose supervisor dies (``follow_stage``): it re-attaches when Ray restarted the supervisor under
its name, from the restarted one's first event, and fails with the loss when the supervisor is gone for good."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import ray

from dockflow.flow import pipeline_tasks
from dockflow.flow.pipeline_tasks import SupervisorLost, follow_stage

LOST = SupervisorLost("the run's supervisor died during follow(update): The actor died unexpectedly")


def reply(**kw: Any) -> dict[str, Any]:
    return {"events": [], "cursor": 0, "complete": False, "phase": "running", "epoch": 0, "iterations": 3,
            "error": "", "mlflow_run_id": "run", "checkpoint_uri": "ckpt", **kw}


class Handle:
    """An actor handle whose calls record their arguments; ``_get`` (patched) answers them in order."""

    def __init__(self, calls: list[tuple]) -> None:
        self.follow = type("M", (), {"remote": staticmethod(lambda *a: calls.append(a))})()
        self.heartbeat = type("M", (), {"remote": staticmethod(lambda: None)})()


def attach(monkeypatch: pytest.MonkeyPatch, replies: list[Any], handles: list[Any]) -> list[tuple]:
    calls: list[tuple] = []
    answers, lookups = iter(replies), iter(handles)

    def get(_ref: Any, _what: str, _timeout_s: float = 0.0) -> Any:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(pipeline_tasks, "_joined", lambda *_a: contextlib.nullcontext())
    monkeypatch.setattr(pipeline_tasks, "_supervisor",
                        lambda *_a, **_kw: (lambda h: Handle(calls) if h == "alive" else h)(next(lookups)))
    monkeypatch.setattr(pipeline_tasks, "_get", get)
    monkeypatch.setattr(ray, "get", lambda *_a, **_kw: None)  # the restarted supervisor answers its heartbeat
    return calls


def test_a_restarted_supervisor_is_reattached_from_its_first_event(monkeypatch, capsys):
    event = {"index": 2, "seconds": 0.2, "metrics": {}}
    calls = attach(monkeypatch, [reply(events=[event], cursor=1), LOST,
                                 reply(events=[event], cursor=1, complete=True, metrics={"train/loss": 0.5})],
                   ["alive", "alive"])
    out = follow_stage("update", "ns", "run", "127.0.0.1:6379")
    assert out["metrics"] == {"train/loss": 0.5}
    assert [c[1] for c in calls] == [0, 1, 0]  # the restarted supervisor's events start again at 0
    assert "its supervisor died and Ray restarted it; re-attached" in capsys.readouterr().out


def test_a_supervisor_gone_for_good_fails_the_task_with_the_loss(monkeypatch):
    attach(monkeypatch, [LOST], ["alive", None])
    with pytest.raises(SupervisorLost, match="died during follow"):
        follow_stage("update", "ns", "run", "127.0.0.1:6379")
