"""What each KFP pipeline task does; the components in ``components/`` call these and nothing else.

``setup`` names the run, stages its initial model, opens its MLflow run and starts its ``RunSupervisor`` on the
Ray cluster, which runs every stage loop there. Each stage task then attaches to its stage (``follow_stage``):
it prints the stage's progress, returns the stage's metrics when the stage has done every iteration, and
fails with the stage's error. ``finish_run`` writes the final model, the summary and the registry decision;
``teardown`` (the exit handler) closes the run. Only ``setup`` imports the heavy parts (torch, transformers);
the other tasks start in seconds.

    info = setup("configs/grpo_arith.yaml", [], RunParams(iterations=2), address="127.0.0.1:6379")
    metrics = follow_stage("generate", info["namespace"], info["run_name"], "127.0.0.1:6379")
    summary = finish_run(info["namespace"], info["run_name"], "127.0.0.1:6379")
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dockflow.flow.supervisor import HEADLINES, supervisor_name
from dockflow.redact import redact_text

log = logging.getLogger(__name__)

RPC_TIMEOUT_S = 120.0  # bound on calls that do no stage work (status, restart, close)
FOLLOW_POLL_S = 5.0  # a stage task's long poll (also its heartbeat)


class PipelineError(RuntimeError):
    """A pipeline task cannot find or use its run; the message says what to do."""


class SupervisorLost(PipelineError):
    """The run's supervisor died during a call (Ray may be restarting it: ``fault_tolerance.max_restarts``)."""


@dataclass(frozen=True)
class RunParams:
    """The pipeline's run-time parameters (the Create-run form); 0 / -1 / "" keep the config's value."""

    run_name: str = ""
    job_id: str = ""  # the KFP run's id: names the run when run_name is empty
    iterations: int = 0
    max_staleness: int = -1
    eval_every: int = -1
    checkpoint_every: int = -1
    continue_from: str = ""
    mlflow_uri: str = ""
    s3_endpoint: str = ""
    s3_bucket: str = ""

    def overrides(self, config_run_name: str) -> list[str]:
        """Config overrides these parameters make (after the user's own)."""
        out = [f"run.name={run_name(self.run_name, self.job_id, config_run_name)}"]
        for key, value, unset in (("train.iterations", self.iterations, 0), ("train.max_staleness", self.max_staleness, -1),
                                  ("eval.every", self.eval_every, -1), ("checkpoint.every", self.checkpoint_every, -1),
                                  ("model.continue_from", self.continue_from, "")):
            if value != unset:
                out.append(f"{key}={value}")
        uri = self.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
        if uri:
            out.append(f"tracking.uri={uri}")
        if self.s3_endpoint:
            out.append(f"checkpoint.s3_endpoint={self.s3_endpoint}")
        if self.s3_bucket:
            out.append(f"checkpoint.dir=s3://{self.s3_bucket}")
        return out


def run_name(explicit: str, job_id: str, config_name: str) -> str:
    """The run's identity: ``explicit`` (resubmitting it resumes the run), else the config's name and the KFP run
    id, so two runs never share a Ray namespace, checkpoint prefix or MLflow run."""
    if explicit:
        return explicit
    if not job_id:
        raise PipelineError("the run has no name: pass the run_name parameter, or the KFP job id (job_id)")
    return f"{config_name}-{re.sub(r'[^A-Za-z0-9]', '', job_id)[:12]}"


def load_run_config(config: str, overrides: list[str], params: RunParams) -> Any:
    from dockflow.config import load_config

    cfg = load_config(config, overrides)
    return load_config(config, [*overrides, *params.overrides(cfg.run.name)])


def ray_address(explicit: str | None) -> str:
    """The Ray cluster a task joins: the pipeline parameter, else ``$RAY_ADDRESS``. Never a new local cluster:
    it would die with the task, and the run with it."""
    address = explicit or os.environ.get("RAY_ADDRESS")
    if not address:
        raise PipelineError(
            "pipeline tasks join a running Ray cluster, but no address was given: set the pipeline parameter "
            "ray_address or the env var RAY_ADDRESS (dockflow pipeline run --local starts a local cluster itself)"
        )
    return address


@contextmanager
def _joined(address: str | None, namespace: str) -> Iterator[None]:
    """Connected to the run's cluster for the duration; the run's actors stay when the task leaves."""
    from dockflow.config import RayConfig
    from dockflow.workers.cluster import connect, disconnect

    owns = connect(RayConfig(address=ray_address(address)), namespace)
    try:
        yield
    finally:
        if owns:
            disconnect()


def _supervisor(run_name: str, namespace: str, missing_ok: bool = False) -> Any:
    import ray

    try:
        return ray.get_actor(supervisor_name(run_name), namespace=namespace)
    except ValueError:
        if missing_ok:
            return None
        raise PipelineError(
            f"run {run_name!r} has no supervisor in Ray namespace {namespace!r}: its setup task failed, or the run "
            "ended (teardown, or abandoned after fault_tolerance.attach_grace_s with no task attached)"
        ) from None


def _get(ref: Any, what: str, timeout_s: float = RPC_TIMEOUT_S) -> Any:
    import ray

    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise PipelineError(f"the run's supervisor did not answer {what} within {timeout_s:.0f}s") from None
    except ray.exceptions.RayActorError as exc:
        raise SupervisorLost(f"the run's supervisor died during {what}: {' '.join(str(exc).split())}") from None


def end_previous_attempt(run_name: str, namespace: str) -> bool:
    """Kill what an earlier attempt of this run left alive (its supervisor owns its workers and dock)."""
    import ray

    sup = _supervisor(run_name, namespace, missing_ok=True)
    if sup is None:
        return False
    log.warning("run %r: ending the live actors of an earlier attempt first", run_name)
    try:
        ray.get(sup.close.remote(False), timeout=RPC_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - it is killed anyway
        log.warning("the earlier attempt's supervisor did not close cleanly: %s", exc)
    ray.kill(sup, no_restart=True)
    deadline = time.monotonic() + RPC_TIMEOUT_S
    while _supervisor(run_name, namespace, missing_ok=True) is not None:
        if time.monotonic() > deadline:
            raise PipelineError(f"the earlier attempt of run {run_name!r} was killed but Ray still lists it")
        time.sleep(0.2)
    return True


def setup(config: str, overrides: list[str], params: RunParams, address: str | None) -> dict[str, str]:
    """Name the run, check that the user's reward functions import, stage its initial model (SFT, cached; or from
    the registry), open its MLflow run and start its supervisor, which creates the dock and workers and starts
    every stage loop; an explicit run name that has checkpoints resumes from the latest. Returns the run's
    coordinates."""
    import ray

    from dockflow.flow.initial_model import prepare_initial_model
    from dockflow.flow.run_record import RunRecord
    from dockflow.flow.run_setup import check_lora_fits, check_model_path, check_reward_functions, run_dir_of
    from dockflow.flow.supervisor import RunSupervisor
    from dockflow.storage import run_store
    from dockflow.tracking import Tracker, run_tags
    from dockflow.workers.cluster import check_reachable_inputs, run_namespace, run_runtime_env
    from dockflow.workers.resources import build_plan
    from dockflow.workers.startup import check_cluster_cpus

    cfg = load_run_config(config, overrides, params)
    plan = build_plan(cfg)  # this task's checks; the supervisor builds the run's own
    check_reward_functions(cfg)
    namespace = run_namespace(cfg)
    with _joined(address, namespace):
        check_reachable_inputs(cfg, plan)
        check_cluster_cpus(plan)  # a plan the cluster can never hold: refused before SFT and the supervisor
        end_previous_attempt(cfg.run.name, namespace)
        store = run_store(cfg.checkpoint, cfg.run)
        step = store.latest()
        state = RunRecord.from_dict(store.read_part(step, "driver")) if step is not None else None
        if state is None:
            check_model_path(cfg)  # a resumed run starts from its staged initial model
            check_lora_fits(cfg)
        tracker = Tracker.start(cfg.tracking, cfg.run.output_dir, cfg.run.name, params=cfg.flat() if state is None else None,
                                 tags={**run_tags(cfg.algorithm.name, cfg.model.path, cfg.dock.backend, cfg.run.name), "driver": "kfp"},
                                 run_id=state.mlflow_run_id if state else None)
        try:
            with tempfile.TemporaryDirectory(prefix="dockflow-setup-") as work:  # gone before any worker loads
                model_uri, init_metrics = prepare_initial_model(cfg, store, Path(work), tracker.tracking_uri)
            if state is None:
                tracker.log_metrics(init_metrics, step=0)
            run_dir = str(run_dir_of(cfg).resolve())
            sup = ray.remote(RunSupervisor).options(
                name=supervisor_name(cfg.run.name), namespace=namespace, lifetime="detached", num_cpus=0,
                max_concurrency=32, max_restarts=cfg.fault_tolerance.max_restarts, runtime_env=run_runtime_env(cfg) or None,
            ).remote(cfg.model_dump(), model_uri, init_metrics, tracker.run_id, run_dir)
            status = _wait_started(sup, cfg)
        except BaseException:
            tracker.end("FAILED")  # the supervisor, if any, is ended by teardown or its attach grace
            raise
    print(f"run {cfg.run.name}: {'resumed from iteration ' + str(step) if step else 'started'}; "
          f"MLflow run {tracker.run_id} at {redact_text(tracker.tracking_uri)}", flush=True)
    return {"namespace": namespace, "run_name": cfg.run.name, "mlflow_run_id": tracker.run_id,
            "checkpoint_uri": status["checkpoint_uri"], "tracking_uri": redact_text(tracker.tracking_uri),
            "experiment_id": tracker.experiment_id, "resumed_from": str(step or 0)}


def _wait_started(sup: Any, cfg: Any) -> dict[str, Any]:
    """Until the supervisor's workers are up (bounded: worker start-up plus one stage); its loops start when the
    first stage task attaches."""
    limit = cfg.ray.init_timeout_s + cfg.ray.engine_init_timeout_s + cfg.train.stage_timeout_s
    deadline = time.monotonic() + limit
    while True:
        status = _get(sup.status.remote(), "status")
        if status["phase"] == "failed":
            raise PipelineError(f"run {cfg.run.name!r} failed to start: {status['error']}")
        if status["phase"] != "starting":
            return status
        if time.monotonic() > deadline:
            raise PipelineError(f"run {cfg.run.name!r}: the workers did not start within {limit:.0f}s "
                                "(ray.init_timeout_s + ray.engine_init_timeout_s + train.stage_timeout_s)")
        sup.heartbeat.remote()
        time.sleep(1.0)


def follow_stage(stage: str, namespace: str, run_name: str, address: str | None) -> dict[str, Any]:
    """Attach to ``stage``'s loop: print its progress until it has done every iteration, then return its metrics
    (mean per key). Finding the run failed on attaching (a KFP retry) restarts the run's loops from the latest
    checkpoint; a failure while attached fails this task with the stage's error. A supervisor that Ray restarts
    (its process died) is re-attached to once it answers (``_reattach``)."""
    from dockflow.flow.waiting import StageError

    with _joined(address, namespace):
        sup = _supervisor(run_name, namespace)
        cursor, epoch, first = 0, None, True
        while True:
            try:
                out = _get(sup.follow.remote(stage, cursor, True, FOLLOW_POLL_S), f"follow({stage})", FOLLOW_POLL_S + RPC_TIMEOUT_S)
            except SupervisorLost as exc:
                sup = _reattach(run_name, namespace, exc)
                cursor, epoch = 0, None
                print(f"{stage}: run {run_name!r}: its supervisor died and Ray restarted it; re-attached (it resumes "
                      "from the latest checkpoint)", flush=True)
                continue
            if epoch is not None and out["epoch"] != epoch:
                print(f"{stage}: the run restarted from its latest checkpoint (attempt {out['epoch'] + 1})", flush=True)
            epoch, cursor = out["epoch"], out["cursor"]
            for event in out["events"]:
                if worth_a_line(event["index"], out["iterations"]):
                    print(progress_line(stage, event, out), flush=True)
            if out["phase"] == "failed" and first:
                print(f"{stage}: run {run_name!r} had failed ({out['error']}); restarting it", flush=True)
                out = _get(sup.restart.remote(out["epoch"]), "restart")
            first = False
            if out["phase"] == "failed":
                raise StageError(f"run {run_name!r}, stage {stage}: {out['error']}")
            if out["phase"] == "stopped":
                raise PipelineError(f"run {run_name!r} was stopped (torn down) before stage {stage} finished")
            if out["complete"]:
                return {"metrics": out.get("metrics", {}), "mlflow_run_id": out["mlflow_run_id"],
                        "checkpoint_uri": out["checkpoint_uri"]}


def _reattach(run_name: str, namespace: str, lost: SupervisorLost) -> Any:
    """The supervisor Ray is restarting under the same name, once it answers (bounded by ``RPC_TIMEOUT_S``); a
    supervisor that is gone for good (killed, or out of ``fault_tolerance.max_restarts``) fails the task with
    ``lost``."""
    import ray

    deadline = time.monotonic() + RPC_TIMEOUT_S
    while True:
        sup = _supervisor(run_name, namespace, missing_ok=True)
        if sup is None:
            raise lost
        try:
            ray.get(sup.heartbeat.remote(), timeout=max(1.0, deadline - time.monotonic()))
            return sup
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass  # still restarting (ActorUnavailableError), or dead and its name not yet released
        if time.monotonic() > deadline:
            raise PipelineError(f"run {run_name!r}: its supervisor died and Ray did not bring it back within "
                                f"{RPC_TIMEOUT_S:.0f}s ({lost})") from None
        time.sleep(1.0)


def worth_a_line(index: int, iterations: int) -> bool:
    """A stage task logs its first 10 iterations, then about 100 lines more in all, and the last one."""
    return index < 10 or index >= iterations - 1 or index % max(1, iterations // 100) == 0


def progress_line(stream: str, event: dict[str, Any], status: dict[str, Any]) -> str:
    """``generate: iteration 12/200 0.41s rollout/response_length=4.20`` (evaluate: the step it scored)."""
    what = "step" if stream == "evaluate" else "iteration"
    index = event["index"] if stream in ("evaluate", "iterations") else event["index"] + 1
    shown = " ".join(f"{k}={v:.4g}" for k, v in event["metrics"].items() if k in HEADLINES[stream])
    return f"{stream}: {what} {index}/{status['iterations']} {event['seconds']:.2f}s {shown}".rstrip()


def finish_run(namespace: str, run_name: str, address: str | None) -> dict[str, Any]:
    """After every stage: the final model, ``summary.json`` and the registry decision; returns the summary."""
    with _joined(address, namespace):
        sup = _supervisor(run_name, namespace)
        status = _get(sup.status.remote(), "status")
        return _get(sup.finish.remote(), "finish", status["stage_timeout_s"] + RPC_TIMEOUT_S)


def teardown(namespace: str, run_name: str, address: str | None, succeeded: bool) -> None:
    """End the run whatever happened: close the MLflow run (FINISHED after ``finish_run``, else FAILED) and kill
    the supervisor, with the workers and dock it owns."""
    import ray

    with _joined(address, namespace):
        sup = _supervisor(run_name, namespace, missing_ok=True)
        if sup is None:
            log.warning("teardown: run %r has no supervisor in namespace %r; nothing to tear down", run_name, namespace)
            return
        try:
            _get(sup.close.remote(succeeded), "close")
        finally:
            ray.kill(sup, no_restart=True)


def teardown_run(config: str, overrides: list[str], params: RunParams, address: str | None, succeeded: bool) -> None:
    """``teardown`` for the exit task, which cannot read the setup task's outputs: the same config, overrides and
    run parameters give the same run name and namespace."""
    from dockflow.workers.cluster import run_namespace

    cfg = load_run_config(config, overrides, params)
    teardown(run_namespace(cfg), cfg.run.name, address, succeeded)


def kfp_metrics(metrics: dict[str, float], artifact: Any) -> None:
    """A stage's metrics into its KFP Metrics artifact."""
    for name, value in sorted(metrics.items()):
        artifact.log_metric(name, float(value))


def mlflow_link(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """Markdown pointing at the MLflow run: a link for a tracking server, the ``mlflow ui`` command otherwise (the
    URI's credentials hidden: ``dockflow.redact``)."""
    tracking_uri = redact_text(tracking_uri)
    if tracking_uri.startswith(("http://", "https://")):
        url = f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
        return f"[MLflow run {run_id}]({url})"
    return f"MLflow run `{run_id}` in `{tracking_uri}`: `mlflow ui --backend-store-uri {tracking_uri}`"


def run_report(summary: dict[str, Any]) -> str:
    """The finish task's Markdown: held-out scores before and after, what was trained, the registry decision."""
    def pct(x: Any) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    lines = [f"# DockFlow run `{summary['run_name']}` ({summary['algorithm']})", "",
             "| | |", "| --- | --- |",
             f"| held-out accuracy before RL | {pct(summary.get('accuracy_before'))} |",
             f"| held-out accuracy after RL | {pct(summary.get('accuracy_after'))} |",
             f"| iterations / samples trained | {summary['iterations']} / {summary['samples_trained']} |",
             f"| throughput (Eq. 5) | {summary['throughput_tps']:.1f} tokens/s/device |",
             f"| final model | `{summary['final_model']}` |"]
    if summary.get("evaluation"):
        lines.append(f"| evaluation fingerprint | `{summary['evaluation']['fingerprint']}` |")
    reg = summary.get("registry")
    if reg:
        lines += [f"| registered | `{reg['model_name']}` version {reg['version']}, score {reg['score']:.4f} |",
                  *([f"| compared | {reg['compared']} |"] if reg.get("compared") else []),
                  f"| champion | {reg['decision']} |"]
    return "\n".join(lines) + "\n"
