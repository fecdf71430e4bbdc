"""The CLI driver of a training run: the initial model, then the stage loops over the transfer dock.

    summary = train(load_config("configs/grpo_arith.yaml"), resume=False)

It checks that the user's reward functions import, stages the initial model (SFT warm start, cached), starts
(or joins) Ray, and runs the run's session (``dockflow.flow.session``: dock, workers, and every iteration's
phases, ``dockflow.flow.iteration``, run by ``dockflow.flow.stage_loops``), then finishes it: final model, ``summary.json``, MLflow, registry. A pipeline
run does the same in its supervisor actor; what both drivers share is in ``dockflow.flow.run_setup``. The
driver only ever handles prompt indices and scalar metrics.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from dockflow.algos.plan import RunPlan
from dockflow.config import Config, ConfigError
from dockflow.flow import run_checkpoint
from dockflow.flow.initial_model import prepare_initial_model
from dockflow.flow.iteration import ProgressFn
from dockflow.flow.run_record import RunRecord
from dockflow.flow.run_setup import (
    check_lora_fits,
    check_model_path,
    check_reward_functions,
    run_dir_of,
    write_run_config,
)
from dockflow.flow.session import RunSession
from dockflow.storage import run_store
from dockflow.tracking import Tracker, run_tags
from dockflow.workers.cluster import (
    HeadWatch,
    connect,
    disconnect,
    head_endpoint,
    joined_address,
    run_namespace,
    run_runtime_env,
)
from dockflow.workers.resources import build_plan

log = logging.getLogger(__name__)


def start_state(store: Any, resume: bool, run_name: str) -> RunRecord | None:
    """The record to go on from: the latest committed checkpoint's when resuming (None: none yet); refuses to
    overwrite the checkpoints of a run that is not resumed."""
    step = store.latest()
    if step is None:
        if resume:
            log.warning("--resume: no committed checkpoint under %s; starting from iteration 0", store.location())
        return None
    if not resume:
        raise ConfigError(
            f"run '{run_name}' already has checkpoints at {store.location()} (latest: iteration {step}): pass "
            "--resume to continue it, or set another run.name"
        )
    return run_checkpoint.read_record(store, step)


def check_cluster(cfg: Config, plan: RunPlan) -> None:
    """engine.device (``dockflow.engines.devices``) and the ``plan``'s devices and CPUs (``dockflow.workers.startup``)
    against the connected Ray cluster's resources."""
    import ray

    from dockflow.engines.devices import check_cluster_devices
    from dockflow.workers.startup import check_cluster_cpus

    check_cluster_devices(cfg.engine.device, plan.devices(), ray.cluster_resources())
    check_cluster_cpus(plan)


def _exit_on_head_lost(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    os._exit(2)


def watch_head(cfg: Config, store: Any, tracker: Tracker, on_lost: Callable[[str], None]) -> HeadWatch | None:
    """With ``ray.address``: a watch on the head that, when it is lost, marks the MLflow run FAILED and calls
    ``on_lost`` with one line naming what was lost, the latest checkpoint and how to resume (``on_lost`` must end
    the process: the stage loops wait in Ray, which would kill it after 60 s with its own message)."""
    if not cfg.ray.address:
        return None
    address = cfg.ray.address if head_endpoint(cfg.ray.address) else joined_address()  # "auto": the one joined

    def lost(what: str) -> None:
        try:
            step = store.latest()
        except Exception:  # noqa: BLE001 - the line matters more than the step
            step = None
        where = f"its latest checkpoint is iteration {step} in {store.location()}" if step else "it has no checkpoint yet"
        try:
            tracker.end("FAILED")
        except Exception as exc:  # noqa: BLE001
            log.warning("could not mark the MLflow run FAILED: %s", exc)
        on_lost(f"{what}: run {cfg.run.name!r} stopped and {where}. Start the cluster again and rerun the same "
                "command with --resume")

    return HeadWatch(address, cfg.ray.head_timeout_s, lost)


def train(cfg: Config, resume: bool = False, on_iteration: ProgressFn | None = None,
          on_head_lost: Callable[[str], None] = _exit_on_head_lost) -> dict[str, Any]:
    """Run SFT (cached) then ``cfg.train.iterations`` RL iterations; returns the summary. ``on_head_lost``: what
    ends the process when the joined cluster's head is lost (``watch_head``)."""
    t_start = time.perf_counter()
    check_reward_functions(cfg)
    plan = build_plan(cfg)  # the run plan, built once here and passed to the session, its workers and the flow
    run_dir = run_dir_of(cfg)
    write_run_config(cfg, run_dir)
    store = run_store(cfg.checkpoint, cfg.run)
    state = start_state(store, resume, cfg.run.name)
    if state is None:
        check_model_path(cfg)  # a resumed run starts from its staged initial model
        check_lora_fits(cfg)
    tags = run_tags(cfg.algorithm.name, cfg.model.path, cfg.dock.backend, cfg.run.name)
    tracker = Tracker.start(cfg.tracking, cfg.run.output_dir, cfg.run.name, params=cfg.flat(), tags=tags,
                            run_id=state.mlflow_run_id if state else None)
    status = "FAILED"
    owns_ray = session = watch = None
    try:
        owns_ray = connect(cfg.ray, run_namespace(cfg), run_runtime_env(cfg))
        watch = watch_head(cfg, store, tracker, on_head_lost)
        check_cluster(cfg, plan)  # a GPU / NPU or CPUs asked for and missing fail here, before SFT and the workers
        model_uri, init_metrics = prepare_initial_model(cfg, store, run_dir, tracker.tracking_uri)
        if state is None:
            state = RunRecord(init_metrics=dict(init_metrics))
            tracker.log_metrics(init_metrics, step=0)
        state.mlflow_run_id = tracker.run_id
        session = RunSession(cfg, plan, model_uri, store, tracker, state, run_dir)
        session.start()
        session.run(on_iteration=on_iteration)
        summary = session.finish(time.perf_counter() - t_start)
        status = "FINISHED"
        return summary
    finally:
        try:
            if session is not None:
                session.close()  # its calls to Ray wait forever for a lost head: the watch ends the process then
            if owns_ray:
                disconnect()
        finally:
            if watch is not None:
                watch.stop()
        tracker.end(status)
