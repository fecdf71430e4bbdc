"""One run's parts on the Ray cluster and their life, the same for both drivers.

``dockflow train`` holds a session in its own process; a pipeline run holds one in its supervisor actor. A
session owns the dock and the workers (created from the staged initial model, restored from the latest
committed checkpoint when there is one), runs the stage loops to the end, restarts them together from the
latest checkpoint after a failure when asked, and finishes the run (final model, summary, registry)::

    plan = build_plan(cfg)                # once, by the driver (dockflow.workers.resources)
    session = RunSession(cfg, plan, model_uri, store, tracker, state, run_dir)
    session.start()                       # dock, workers, restore
    session.run(on_iteration=progress)    # the stage loops, to the end
    summary = session.finish(wall_s)
    session.close()                       # kill the workers and the dock
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dockflow.algos.plan import RunPlan
from dockflow.config import Config
from dockflow.flow import run_checkpoint
from dockflow.flow.final_model import finish
from dockflow.flow.iteration import ProgressFn, RunParts, RunTasks
from dockflow.flow.run_record import RunRecord
from dockflow.flow.stage_loops import Schedule, StageLoops
from dockflow.flow.waiting import StageError, out_of_restarts, wait_stages
from dockflow.rollout.prompts import iteration_sampler, overlong_train_prompts
from dockflow.tracking import Tracker
from dockflow.workers import Workers, create_workers, kill_workers
from dockflow.workers.cluster import run_namespace
from dockflow.workers.run_dock import create_run_dock

log = logging.getLogger(__name__)

StageFn = Callable[[str, int, dict[str, float], float], None]


def eval_due(cfg: Config, step: int) -> bool:
    """Whether the run evaluates at ``step`` (every ``eval.every`` iterations, and at the last)."""
    every = cfg.eval.every
    return step == cfg.train.iterations or (every > 0 and step % every == 0)


def ckpt_due(cfg: Config, step: int) -> bool:
    """Whether the run checkpoints at ``step`` (every ``checkpoint.every`` iterations, and at the last)."""
    every = cfg.checkpoint.every
    return step == cfg.train.iterations or (every > 0 and step % every == 0)


class RunSession:
    """A run's dock, workers, checkpoint store, MLflow run and record (``state``: a fresh ``RunRecord`` or a
    checkpoint's), from the run ``plan`` the driver built (``dockflow.workers.resources.build_plan``)."""

    def __init__(self, cfg: Config, plan: RunPlan, model_uri: str, store: Any, tracker: Tracker, state: RunRecord,
                 run_dir: Path) -> None:
        self.cfg, self.plan, self.model_uri, self.store, self.tracker = cfg, plan, model_uri, store, tracker
        self.state, self.run_dir = state, run_dir
        self.excluded = overlong_train_prompts(cfg, model_uri)  # the length policy's, derived once
        self.sampler = iteration_sampler(cfg, plan, self.excluded)
        self.dock: Any = None
        self.workers: Workers | None = None
        self.schedule: Schedule | None = None

    def start(self) -> None:
        """Create the dock and the workers; restore them (and what was in flight) from the checkpoint the record
        came from, if any."""
        cfg, step = self.cfg, self.state.iteration or None
        self.dock = create_run_dock(cfg, self.plan, run_namespace(cfg))
        self.workers = create_workers(cfg, self.plan, self.model_uri, self.dock, cfg.run.name, self.excluded)
        generated: dict[int, dict[str, float]] = {}
        if step is not None:
            run_checkpoint.restore_workers(self.store, self.workers, step, cfg)
            if self.workers.generators:  # their checkpoints always hold the part, empty when nothing was ahead
                ref = self.workers.generators[0].load_inflight.remote(self.store, step, self.workers.rollout_queue)
                wait_stages({"restore_inflight": ref}, cfg.train.stage_timeout_s, step)
            generated = {j: dict(m) for j, m in self.state.inflight.items()}
        self.schedule = self._schedule(step or 0, generated)
        self.state.resumed_from = self.schedule.start  # where this attempt started (0: from the beginning)

    def _schedule(self, start: int, generated: dict[int, dict[str, float]]) -> Schedule:
        cfg, end = self.cfg, self.cfg.train.iterations
        evaluated = self.state.evaluated_steps
        steps = range(start, end + 1)
        return Schedule(
            start=start, end=end, max_staleness=cfg.train.max_staleness,
            eval_steps=[k for k in steps if (k == 0 or eval_due(cfg, k)) and k not in evaluated],
            checkpoint_steps={k for k in steps if k > start and ckpt_due(cfg, k)},
            generated=generated, in_rounds=self.plan.sampling.in_rounds,
            publish_first=bool(self.workers.generators) and start > 0,
        )

    def run(self, on_iteration: ProgressFn | None = None, on_stage: StageFn | None = None,
            on_complete: Callable[[str], None] | None = None, stop: threading.Event | None = None) -> None:
        """The stage loops, from the record's iteration to the end. With ``fault_tolerance.restart`` a worker (or a
        dock process) that dies restarts the run from the latest checkpoint, up to ``max_restarts`` times, then the
        run stops with one line (``out_of_restarts``); any other failure raises."""
        while True:
            tasks = RunTasks(self.parts(), self.schedule.start, on_iteration)
            tasks.generated.update(self.schedule.generated)
            loops = StageLoops(self.schedule, tasks, self.cfg.train.stage_timeout_s, on_stage=on_stage,
                               on_complete=on_complete, stop=stop)
            try:
                loops.run()
                return
            except StageError as exc:
                ft = self.cfg.fault_tolerance
                if not (exc.worker_died and ft.restart):
                    raise
                if self.state.restarts >= ft.max_restarts:
                    raise StageError(out_of_restarts(str(exc), ft.max_restarts)) from exc
                self.restart(str(exc))

    def parts(self) -> RunParts:
        """This attempt's workers, dock and record, with the run's config, prompt order, store and tracker."""
        return RunParts(cfg=self.cfg, plan=self.plan, workers=self.workers, dock=self.dock, sampler=self.sampler, store=self.store,
                        tracker=self.tracker, state=self.state)

    def restart(self, reason: str) -> None:
        """Kill the workers and the dock, go back to the latest committed checkpoint (or the start, keeping the
        evaluation before RL) and start again; iterations after it run again and are counted once."""
        self.close()
        step = self.store.latest()
        self.state = self.state.restarted(run_checkpoint.read_record(self.store, step) if step is not None else None)
        log.warning("%s; restarting the run from %s", reason, f"checkpoint {step}" if step else "the initial model")
        self.start()
        self.tracker.log_metrics_or_defer({"fault/restarts": self.state.restarts}, step=self.schedule.start)

    def finish(self, wall_s: float) -> dict[str, Any]:
        """The run is done: final model (staged in the checkpoint store), ``summary.json``, MLflow artifacts, and the
        final model registered (with the champion decision) when ``registry.model_name`` is set."""
        return finish(self.cfg, self.run_dir, self.workers, self.store, self.tracker, self.state,
                      model_uri=self.model_uri, wall_s=wall_s)

    def close(self) -> None:
        """Kill the workers and the dock (idempotent)."""
        workers, dock = self.workers, self.dock
        self.workers = self.dock = None
        try:
            if workers is not None:
                kill_workers(workers)
        finally:
            if dock is not None:
                dock.shutdown()
