"""A pipeline run's supervisor: one detached Ray actor per run that runs its stage loops on the cluster.

KFP tasks are short-lived processes (under ``kfp.local`` they even run one at a time), so the loops cannot
live in them. The setup task creates this actor; it holds the run's session (``dockflow.flow.session``: the
dock and workers it owns, so they die with it) and runs the same stage loops as ``dockflow train`` in a
thread. Each stage task attaches to its stage here (``follow``): it prints the stage's progress, ends when
the stage has done every iteration, fails with the stage's error, and outputs the stage's metrics. The loops start when the first stage task attaches (the workers are up by then), so no
iteration runs unobserved.

- A failure stops every loop; the run is then ``failed``. A stage task that attaches to a failed run (a
  KFP retry) restarts the loops together from the latest committed checkpoint (``restart``), at most
  ``fault_tolerance.max_restarts`` times; a worker that dies restarts them at once with
  ``fault_tolerance.restart``.
- When this actor's process dies, Ray restarts it (``max_restarts``): the new one waits until the old workers'
  and dock's names are released, resumes from the latest committed checkpoint (one more restart), and the
  attached stage tasks re-attach (``dockflow.flow.pipeline_tasks.follow_stage``).
- Every ``follow`` is a heartbeat. When no task has attached for ``fault_tolerance.attach_grace_s`` (KFP
  terminated the run, and its exit handler may not have run), the loops stop, the MLflow run is marked
  KILLED and the actor kills itself with the run's workers and dock.

Only light imports at module level: a task that looks this actor up imports this module.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from typing import Any

from dockflow.flow.waiting import out_of_restarts
from dockflow.redact import redact_text

log = logging.getLogger(__name__)

PHASES = ("starting", "ready", "running", "done", "failed", "finished", "stopped")
HEADLINES = {  # what a stage task prints per iteration, besides the seconds
    "generate": ("rollout/response_length", "rollout/policy_version"),
    "infer": ("reward/mean",),
    "update": ("train/pg_loss", "train/loss"),
    "reshard": (),
    "evaluate": ("eval/test_accuracy",),
    "iterations": ("reward/mean", "eval/test_accuracy", "timing/iteration_s"),
}


SUPERVISOR_SUFFIX = "-supervisor"


def supervisor_name(run_name: str) -> str:
    return f"{run_name}{SUPERVISOR_SUFFIX}"


class RunSupervisor:
    """Create with ``ray.remote(RunSupervisor)``, detached, threaded (see ``dockflow.flow.pipeline_tasks.setup``)."""

    def __init__(self, config: dict[str, Any], model_uri: str, init_metrics: dict[str, float], mlflow_run_id: str,
                 run_dir: str) -> None:
        from pathlib import Path

        from dockflow.config import Config
        from dockflow.storage import run_store
        from dockflow.tracking import Tracker
        from dockflow.workers.resources import build_plan

        self.cfg = cfg = Config.model_validate(config)
        self.plan = build_plan(cfg)  # the run plan, built once in this driver and passed to the session
        self.model_uri, self.init_metrics, self.run_dir = model_uri, init_metrics, Path(run_dir)
        self.store = run_store(cfg.checkpoint, cfg.run)
        self.tracker = Tracker.start(cfg.tracking, cfg.run.output_dir, cfg.run.name, run_id=mlflow_run_id)
        self.lock = threading.Condition()
        self.phase, self.error, self.epoch = "starting", "", 0
        self.events: dict[str, list[dict[str, Any]]] = {s: [] for s in HEADLINES}
        self.results: dict[str, dict[int, dict[str, float]]] = {s: {} for s in HEADLINES}
        self.complete: set[str] = set()
        self.attached_at = time.monotonic()
        self.followed = False  # a stage task has attached: the loops may start
        self.stop = threading.Event()
        self.session: Any = None
        self.summary: dict[str, Any] | None = None
        self.started_at = time.time()
        self.main = threading.Thread(target=self._main, args=(None,), daemon=True, name="stage-loops")
        self.main.start()
        threading.Thread(target=self._watchdog, daemon=True, name="attach-watchdog").start()

    # ---- the loops ----

    def _main(self, restart_reason: str | None) -> None:
        from dockflow.flow.run_setup import write_run_config
        from dockflow.flow.stage_loops import RunStopped

        try:
            if restart_reason is not None:
                self.session.restart(restart_reason)
            else:
                write_run_config(self.cfg, self.run_dir)
                self._start_session()
                self._set_phase("ready")
                with self.lock:  # no iteration runs unobserved: the loops start when a stage task attaches
                    while not (self.followed or self.stop.is_set()):
                        self.lock.wait(timeout=1.0)
                if self.stop.is_set():
                    raise RunStopped("the run was ended before a stage task attached")
            self._set_phase("running")
            self.session.run(on_iteration=self._on_iteration, on_stage=self._on_stage,
                             on_complete=self._on_complete, stop=self.stop)
            self._set_phase("done")
        except RunStopped:
            self._set_phase("stopped")
        except BaseException as exc:  # noqa: BLE001 - every failure ends the loops; tasks report it
            self._set_phase("failed", f"{type(exc).__name__}: {exc}")

    def _start_session(self) -> None:
        """The run's session from its latest committed checkpoint (or its start). Ray restarting this actor (its
        process died: ``max_restarts``) counts as a restart of the run; the earlier incarnation's workers and dock
        die with it, and their names must be free before this one creates its own."""
        import ray

        from dockflow.flow import run_checkpoint
        from dockflow.flow.run_record import RunRecord
        from dockflow.flow.session import RunSession
        from dockflow.workers.cluster import run_namespace
        from dockflow.workers.group import wait_run_names_released

        waited = wait_run_names_released(self.cfg, self.plan, run_namespace(self.cfg), self.cfg.ray.init_timeout_s)
        with warnings.catch_warnings():  # Ray 2.60's property reads its own deprecated actor_id
            warnings.simplefilter("ignore")
            reconstructed = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        step = self.store.latest()
        state = RunRecord(init_metrics=dict(self.init_metrics)) if step is None else run_checkpoint.read_record(self.store, step)
        state.mlflow_run_id = self.tracker.run_id
        if reconstructed:
            state.restarts += 1
            log.warning("run %r: its supervisor was restarted by Ray; resuming from %s (waited %.1fs for the earlier "
                        "workers' names)", self.cfg.run.name, f"checkpoint {step}" if step else "the start", waited)
        self.session = RunSession(self.cfg, self.plan, self.model_uri, self.store, self.tracker, state, self.run_dir)
        self.session.start()
        if reconstructed:
            self.tracker.log_metrics_or_defer({"fault/restarts": state.restarts}, step=self.session.schedule.start)

    def _set_phase(self, phase: str, error: str = "") -> None:
        with self.lock:
            self.phase, self.error = phase, error
            self.lock.notify_all()

    def _event(self, stream: str, index: int, metrics: dict[str, float], seconds: float) -> None:
        shown = {k: metrics[k] for k in HEADLINES[stream] if k in metrics}
        with self.lock:
            self.results[stream][index] = dict(metrics)
            self.events[stream].append({"index": index, "seconds": seconds, "metrics": shown, "epoch": self.epoch})
            self.lock.notify_all()

    def _on_stage(self, stage: str, index: int, metrics: dict[str, float], seconds: float) -> None:
        self._event(stage, index, metrics, seconds)

    def _on_iteration(self, step: int, metrics: dict[str, float]) -> None:
        self._event("iterations", step, metrics, metrics.get("timing/iteration_s", 0.0))

    def _on_complete(self, stage: str) -> None:
        with self.lock:
            self.complete.add(stage)
            self.lock.notify_all()

    # ---- what tasks call ----

    def status(self) -> dict[str, Any]:
        """Plain values only: unpickling them must not import torch in the task process."""
        iteration = self.session.state.iteration if self.session is not None else 0
        return {"phase": self.phase, "error": self.error, "epoch": self.epoch, "iteration": iteration,
                "iterations": self.cfg.train.iterations, "mlflow_run_id": self.tracker.run_id,
                "experiment_id": self.tracker.experiment_id, "tracking_uri": redact_text(self.tracker.tracking_uri),
                "checkpoint_uri": self.store.location(), "stage_timeout_s": self.cfg.train.stage_timeout_s}

    def follow(self, stream: str, cursor: int, heartbeat: bool = True, wait_s: float = 5.0) -> dict[str, Any]:
        """Events of ``stream`` (a stage, or "iterations") after ``cursor``, waiting up to ``wait_s`` for one;
        with the run's phase and, once the stage has done every iteration, its metrics (mean per key)."""
        if stream not in self.events:
            raise ValueError(f"unknown stage {stream!r}; the stages are {list(self.events)}")
        deadline = time.monotonic() + wait_s
        with self.lock:
            if heartbeat:
                self.attached_at = time.monotonic()
                self.followed = True
                self.lock.notify_all()
            while len(self.events[stream]) <= cursor and self.phase in ("starting", "ready", "running") \
                    and stream not in self.complete and time.monotonic() < deadline:
                self.lock.wait(timeout=max(0.0, deadline - time.monotonic()))
            if heartbeat:
                self.attached_at = time.monotonic()
            events = self.events[stream][cursor:]
            done = stream in self.complete or (stream == "iterations" and self.phase in ("done", "finished"))
            out = {"events": events, "cursor": cursor + len(events), "complete": done, **self.status()}
            if done:
                out["metrics"] = _means(self.results[stream].values())
            return out

    def heartbeat(self) -> None:
        with self.lock:
            self.attached_at = time.monotonic()

    def restart(self, epoch: int) -> dict[str, Any]:
        """A retried task found the run failed in ``epoch``: restart every loop from the latest checkpoint (once per
        failure, however many tasks ask; refused after ``fault_tolerance.max_restarts``)."""
        with self.lock:
            self.attached_at = time.monotonic()
            if self.phase != "failed" or self.epoch != epoch:
                return self.status()
            if self.session is None:
                return self.status()
            max_restarts = self.cfg.fault_tolerance.max_restarts
            if self.session.state.restarts >= max_restarts:
                self.error = out_of_restarts(self.error, max_restarts)  # the line every retried task fails with
                return self.status()
            reason, self.epoch, self.phase = self.error, self.epoch + 1, "starting"
            self.complete.clear()
            self.stop = threading.Event()
        self.main.join(timeout=self.cfg.train.stage_timeout_s)
        self.main = threading.Thread(target=self._main, args=(reason,), daemon=True, name="stage-loops")
        self.main.start()
        return self.status()

    def finish(self) -> dict[str, Any]:
        """Once every loop is done: the final model, summary and registry (``dockflow.flow.final_model``). Idempotent."""
        with self.lock:
            self.attached_at = time.monotonic()
            self.followed = True  # a finish task is attached too: a supervisor Ray restarted runs what is left
            self.lock.notify_all()
            ok = self.lock.wait_for(lambda: self.phase not in ("starting", "ready", "running"),
                                    timeout=self.cfg.train.stage_timeout_s)
            if self.summary is not None:
                return self.summary
            if not ok or self.phase != "done":
                raise RuntimeError(f"run {self.cfg.run.name!r} cannot finish: its loops are {self.phase} {self.error}")
        self.summary = self.session.finish(time.time() - self.started_at)
        self._set_phase("finished")
        return self.summary

    def close(self, succeeded: bool) -> None:
        """End the run: stop the loops, close the MLflow run (FINISHED only after ``finish``), kill the workers and
        the dock. The caller then kills this actor."""
        self.stop.set()
        self.main.join(timeout=60)
        if not self.tracker.ended:
            self.tracker.end("FINISHED" if succeeded and self.summary is not None else "FAILED")
        if self.session is not None:
            self.session.close()

    # ---- the watchdog ----

    def _watchdog(self) -> None:
        grace = self.cfg.fault_tolerance.attach_grace_s
        while True:
            time.sleep(min(1.0, grace / 4))
            with self.lock:
                idle = time.monotonic() - self.attached_at
                if self.phase == "finished" or idle < grace:
                    continue
            self._abandon(idle)
            return

    def _abandon(self, idle: float) -> None:
        """No task attached for the grace period: stop, mark the MLflow run KILLED, and end this actor."""
        import ray

        self.error = f"no pipeline task attached for {idle:.0f}s (fault_tolerance.attach_grace_s): run abandoned"
        self.stop.set()
        self.main.join(timeout=60)
        try:
            if not self.tracker.ended:
                self.tracker.log_metrics_or_defer({"fault/abandoned": 1.0}, step=self.cfg.train.iterations)
                self.tracker.end("KILLED")
            if self.session is not None:
                self.session.close()
        finally:
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


def _means(rows: Any) -> dict[str, float]:
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for row in rows:
        for k, v in row.items():
            sums[k] = sums.get(k, 0.0) + float(v)
            counts[k] = counts.get(k, 0) + 1
    return {k: sums[k] / counts[k] for k in sums}
