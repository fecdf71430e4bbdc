"""What ``dockflow pipeline ...`` does: compile the RL pipeline, run it on this machine under ``kfp.local``,
submit it to a Kubeflow Pipelines host, or schedule it there as a recurring run.

    dockflow pipeline compile configs/grpo_arith.yaml --out runs/dockflow_rl.yaml
    dockflow pipeline run configs/grpo_arith.yaml --local train.iterations=2
    dockflow pipeline run configs/grpo_arith.yaml --host http://localhost:8080
    dockflow pipeline schedule configs/grpo_arith.yaml --host http://localhost:8080 --cron "0 0 2 * * *"
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from dockflow.config import Config
from pipelines.rl_pipeline import PIPELINE_NAME, PipelineOptions, build_pipeline

HOST_TIMEOUT_S = 10.0


class LaunchError(RuntimeError):
    """The pipeline could not be compiled, submitted or scheduled; the message says why and what to do."""


def options_for(cfg: Config, accelerator: str = "cpu", accelerator_count: int = 1) -> PipelineOptions:
    """The DAG the config asks for: its iterations, staleness bound and evaluation interval."""
    return PipelineOptions(
        iterations=cfg.train.iterations,
        max_staleness=cfg.train.max_staleness,
        eval_every=cfg.eval.every,
        accelerator=accelerator,
        accelerator_count=accelerator_count,
    )


def compile_pipeline(opts: PipelineOptions, out: str | Path) -> Path:
    """Write the pipeline's IR YAML (what the KFP UI uploads) to ``out``."""
    from kfp import compiler

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(opts), str(path))
    return path


def arguments(config: str, overrides: list[str], cfg: Config, **params: str) -> dict[str, Any]:
    """Pipeline parameters: the config path, the user's overrides, the run name and the non-empty extras."""
    return {"config": config, "overrides": list(overrides), "run_name": cfg.run.name,
            **{k: v for k, v in params.items() if v}}


def run_local(config: str, overrides: list[str], cfg: Config, opts: PipelineOptions) -> dict[str, Any]:
    """Run the pipeline here: a local Ray cluster that the tasks join, ``kfp.local`` running each task as a
    subprocess. Returns the run's summary (what ``dockflow train`` writes too)."""
    import ray
    from kfp import local

    from dockflow.flow.trainer import run_dir_of
    from dockflow.workers.cluster import connect, disconnect, run_namespace

    run_dir = run_dir_of(cfg).resolve()
    # Tasks run in other processes: give them absolute paths.
    overrides = [*overrides, f"run.output_dir={Path(cfg.run.output_dir).resolve()}"]
    config = str(Path(config).resolve())
    owns = connect(cfg.ray, run_namespace(cfg))
    try:
        address = ray.get_runtime_context().gcs_address
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(run_dir / "kfp"), raise_on_error=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*non-Python base image.*", category=RuntimeWarning)
            build_pipeline(opts)(**arguments(config, overrides, cfg, ray_address=address))
    finally:
        if owns:
            disconnect()
    summary = run_dir / "summary.json"
    if not summary.exists():
        raise LaunchError(f"the pipeline finished but wrote no {summary}; see the teardown task's log above")
    return json.loads(summary.read_text())


def check_host(host: str) -> None:
    """Fail fast, naming the host, when the KFP API does not answer."""
    import requests

    url = f"{host.rstrip('/')}/apis/v2beta1/healthz"
    try:
        requests.get(url, timeout=HOST_TIMEOUT_S).raise_for_status()
    except requests.RequestException as exc:
        raise LaunchError(
            f"cannot reach Kubeflow Pipelines at {host} ({url}: {exc}). Check the URL, or port-forward the UI: "
            "kubectl -n kubeflow port-forward svc/ml-pipeline-ui 8080:80"
        ) from None


def _client(host: str):
    import kfp

    check_host(host)
    return kfp.Client(host=host)


def submit(host: str, params: dict[str, Any], opts: PipelineOptions, experiment: str) -> str:
    """Start one run on a KFP host; returns its run id."""
    client = _client(host)
    result = client.create_run_from_pipeline_func(
        build_pipeline(opts), arguments=params, experiment_name=experiment, enable_caching=False
    )
    return result.run_id


def check_cron(cron: str) -> str:
    """KFP's cron has six fields (seconds first): ``0 0 2 * * *`` is every day at 02:00."""
    if len(cron.split()) != 6:
        raise LaunchError(
            f"--cron {cron!r} has {len(cron.split())} fields; KFP wants 6 (second minute hour day month weekday), "
            'e.g. "0 0 2 * * *" for 02:00 every day'
        )
    return cron


def schedule(
    host: str, cron: str, params: dict[str, Any], opts: PipelineOptions, experiment: str, job_name: str, package: Path
) -> str:
    """Create a recurring run on a KFP host from the compiled ``package``; returns its id."""
    check_cron(cron)
    client = _client(host)
    compile_pipeline(opts, package)
    exp = client.create_experiment(name=experiment)
    job = client.create_recurring_run(
        experiment_id=exp.experiment_id,
        job_name=job_name,
        cron_expression=cron,
        pipeline_package_path=str(package),
        params=params,
        max_concurrency=1,  # a run must finish before the next one starts: they share run names and checkpoints
        enable_caching=False,
    )
    return job.recurring_run_id


def default_package(cfg: Config) -> Path:
    return Path(cfg.run.output_dir) / f"{PIPELINE_NAME}.yaml"
