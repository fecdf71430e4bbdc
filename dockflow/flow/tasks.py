"""What each KFP pipeline task does; the components in ``components/`` call these and nothing else.

``setup`` creates the run on the Ray cluster: the dock, the workers and a ``PipelineDriver``, all named and
detached in the run's namespace. Every later task joins the cluster, asks that driver to run one stage
(``run_stage``) and waits; ``teardown`` has it write the summary and then kills the run's actors. Only
``setup`` imports the heavy parts (torch, transformers, MLflow): the other tasks start in seconds.

    info = setup("configs/grpo_arith.yaml", ["train.iterations=2"], address="127.0.0.1:6379")
    metrics = run_stage("generate", info["namespace"], info["run_name"], "127.0.0.1:6379", 0)["metrics"]
    summary = teardown(info["namespace"], info["run_name"], "127.0.0.1:6379", succeeded=True)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

RPC_TIMEOUT_S = 120.0  # bound on calls that do no stage work (info, shutdown)
STAGE_GRACE_S = 60.0  # a stage call may take the stage timeout plus this before the task gives up


class PipelineError(RuntimeError):
    """A pipeline task cannot find or use its run; the message says what to do."""


def driver_name(run_name: str) -> str:
    return f"{run_name}-driver"


def ray_address(explicit: str | None) -> str:
    """The Ray cluster a task joins: the pipeline parameter, else ``$RAY_ADDRESS``. Never a new local cluster:
    it would die with the task, and the run's actors with it."""
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

    connect(RayConfig(address=ray_address(address)), namespace)
    try:
        yield
    finally:
        disconnect()


def _driver(run_name: str, namespace: str, missing_ok: bool = False) -> Any:
    import ray

    try:
        return ray.get_actor(driver_name(run_name), namespace=namespace)
    except ValueError:
        if missing_ok:
            return None
        raise PipelineError(
            f"run {run_name!r} has no driver in Ray namespace {namespace!r}: its setup task did not run or failed, "
            "or teardown already ended it"
        ) from None


def setup(config: str, overrides: list[str], address: str | None) -> dict[str, str]:
    """Load the config, warm-start the model (SFT, cached), start the MLflow run, open the checkpoint store, and
    create the run's dock, workers and driver as named detached actors. Returns the run's coordinates."""
    import ray
    import yaml

    from dockflow.config import load_config
    from dockflow.flow.pipeline_driver import PipelineDriver
    from dockflow.flow.trainer import run_dir_of
    from dockflow.models.initial import initial_model
    from dockflow.storage import open_store
    from dockflow.tracking import Tracker, run_tags
    from dockflow.workers import create_workers, kill_workers
    from dockflow.workers.cluster import run_namespace
    from dockflow.workers.columns import create_run_dock

    cfg = load_config(config, overrides)
    run_dir = run_dir_of(cfg).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
    model_dir, init_metrics = initial_model(cfg, run_dir)
    store = open_store(cfg.checkpoint, run_dir)
    namespace = run_namespace(cfg)
    with _joined(address or cfg.ray.address, namespace):
        if _driver(cfg.run.name, namespace, missing_ok=True) is not None:
            raise PipelineError(
                f"run {cfg.run.name!r} already has live actors in Ray namespace {namespace!r} (an earlier pipeline "
                f"run did not tear down): pick another run.name, or `dockflow pipeline teardown {cfg.run.name}`"
            )
        dock = workers = tracker = None
        try:
            tags = {**run_tags(cfg), "driver": "kfp"}
            tracker = Tracker.start(cfg.tracking, run_dir, cfg.run.name, params=cfg.flat(), tags=tags)
            tracker.log_metrics(init_metrics, step=0)
            dock = create_run_dock(cfg, namespace, detached=True)
            workers = create_workers(cfg, model_dir, dock, cfg.run.name, detached=True)
            handles = {"config": cfg.model_dump(), "model_dir": model_dir, "run_dir": str(run_dir), "dock": dock,
                       "workers": workers, "store": store}
            driver = ray.remote(PipelineDriver).options(
                name=driver_name(cfg.run.name), namespace=namespace, lifetime="detached", num_cpus=0,
                max_concurrency=8,  # stages of different iterations may overlap (max_staleness > 0)
            ).remote(handles, init_metrics, tracker.run_id)
            info = ray.get(driver.info.remote(), timeout=cfg.ray.init_timeout_s)
        except BaseException:
            if workers is not None:
                kill_workers(workers)
            if dock is not None:
                dock.shutdown()
            if tracker is not None:
                tracker.end("FAILED")
            raise
    return {"namespace": namespace, "run_name": cfg.run.name, "mlflow_run_id": info["mlflow_run_id"],
            "checkpoint_uri": info["checkpoint_uri"]}


def run_stage(stage: str, namespace: str, run_name: str, address: str | None, index: int) -> dict[str, Any]:
    """Have the run's driver run ``stage`` of iteration ``index`` (for ``evaluate``: the step it scores).

    Returns ``{"metrics": {...}, "mlflow_run_id": ..., "checkpoint_uri": ...}``."""
    import ray

    from dockflow.flow.waiting import StageError

    with _joined(address, namespace):
        driver = _driver(run_name, namespace)
        info = ray.get(driver.info.remote(), timeout=RPC_TIMEOUT_S)
        ref = driver.run_stage.remote(stage, index)
        limit = info["stage_timeout_s"] + STAGE_GRACE_S
        try:
            metrics = ray.get(ref, timeout=limit)
        except ray.exceptions.GetTimeoutError:
            raise StageError(
                f"run {run_name!r}: stage {stage} of iteration {index} did not finish within {limit:.0f}s "
                "(train.stage_timeout_s plus a grace period)"
            ) from None
        except ray.exceptions.RayTaskError as exc:
            raise StageError(f"run {run_name!r}: stage {stage} of iteration {index} failed: {exc.cause!r}") from None
        return {"metrics": metrics, "mlflow_run_id": info["mlflow_run_id"], "checkpoint_uri": info["checkpoint_uri"]}


def teardown(namespace: str, run_name: str, address: str | None, succeeded: bool) -> dict[str, Any]:
    """End the run: on success the final model and ``summary.json``; always close the MLflow run and kill the
    run's actors. Returns the summary (empty when the run failed or was already torn down)."""
    import ray

    with _joined(address, namespace):
        driver = _driver(run_name, namespace, missing_ok=True)
        if driver is None:
            log.warning("teardown: run %r has no driver in namespace %r; nothing to tear down", run_name, namespace)
            return {}
        limit = RPC_TIMEOUT_S
        try:
            # finish saves the final model: bounded like a stage
            limit = ray.get(driver.info.remote(), timeout=RPC_TIMEOUT_S)["stage_timeout_s"] + STAGE_GRACE_S
            return ray.get(driver.finish.remote(succeeded), timeout=limit)
        except ray.exceptions.GetTimeoutError:
            raise PipelineError(
                f"teardown of run {run_name!r}: the driver did not answer within {limit:.0f}s; "
                "its actors are killed anyway"
            ) from None
        finally:
            try:
                ray.get(driver.shutdown.remote(), timeout=RPC_TIMEOUT_S)
            finally:
                ray.kill(driver, no_restart=True)


def teardown_run(config: str, overrides: list[str], run_name: str, address: str | None, succeeded: bool) -> dict[str, Any]:
    """``teardown`` for the exit task, which cannot read the setup task's outputs: it finds the run from the same
    config, overrides and run name the setup task got."""
    from dockflow.config import load_config
    from dockflow.workers.cluster import run_namespace

    cfg = load_config(config, [*overrides, *platform_overrides(run_name, "", "", "")])
    return teardown(run_namespace(cfg), cfg.run.name, address, succeeded)


def platform_overrides(run_name: str, mlflow_uri: str, s3_endpoint: str, s3_bucket: str) -> list[str]:
    """Config overrides from the pipeline's parameters; an empty one leaves the config alone, except the MLflow
    URI, which falls back to ``$MLFLOW_TRACKING_URI`` (set from the cluster's ConfigMap) before the config."""
    out = [f"run.name={run_name}"] if run_name else []
    uri = mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    if uri:
        out.append(f"tracking.uri={uri}")
    if s3_endpoint:
        out.append(f"checkpoint.s3_endpoint={s3_endpoint}")
    if s3_bucket:
        if not run_name:
            raise PipelineError("s3_bucket needs run_name: checkpoints go to s3://<s3_bucket>/<run_name>")
        out.append(f"checkpoint.dir=s3://{s3_bucket}/{run_name}")
    return out


def kfp_outputs(result: dict[str, Any], metrics: Any) -> tuple[str, str]:
    """A stage's result as a KFP component's outputs: every metric into the Metrics artifact, then the MLflow
    run id and checkpoint URI."""
    for name, value in sorted(result["metrics"].items()):
        metrics.log_metric(name, float(value))
    return result["mlflow_run_id"], result["checkpoint_uri"]
