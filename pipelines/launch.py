"""What ``dockflow pipeline ...`` does: compile the RL pipeline, run it on this machine under ``kfp.local``,
submit it to a Kubeflow Pipelines host, or schedule it there as a recurring run.

    dockflow pipeline compile --config configs/grpo_arith.yaml --out runs/dockflow-rl.yaml
    dockflow pipeline run --local --iterations 2
    dockflow pipeline run --host http://localhost:8080 --iterations 1000
    dockflow pipeline schedule --host http://localhost:8080 --cron "0 0 2 * * *" --continue-from champion
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from dockflow.config import Config
from dockflow.flow.supervisor import SUPERVISOR_SUFFIX
from pipelines.rl_pipeline import PIPELINE_CHECKPOINT_EVERY, PIPELINE_NAME, PipelineOptions, build_pipeline

HOST_TIMEOUT_S = 10.0
RUNTIME_PARAMETERS = ("run_name", "iterations", "max_staleness", "eval_every", "checkpoint_every", "continue_from",
                      "ray_address", "mlflow_uri", "s3_endpoint", "s3_bucket", "image")


class LaunchError(RuntimeError):
    """The pipeline could not be compiled, submitted or scheduled; the message says why and what to do."""


def options_for(cfg: Config, config: str = "configs/grpo_arith.yaml") -> PipelineOptions:
    """The Create-run form's defaults from ``cfg``: its iterations, staleness bound and evaluation interval, and
    the pipeline's checkpoint cadence (the config's, at most every 10 iterations)."""
    every = cfg.checkpoint.every
    return PipelineOptions(
        config=config, iterations=max(1, cfg.train.iterations), max_staleness=cfg.train.max_staleness,
        eval_every=cfg.eval.every, checkpoint_every=min(every, PIPELINE_CHECKPOINT_EVERY) if every else PIPELINE_CHECKPOINT_EVERY,
    )


def compile_pipeline(opts: PipelineOptions, out: str | Path) -> Path:
    """Write the pipeline's IR YAML (what the KFP UI uploads) to ``out``."""
    from kfp import compiler

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(opts), str(path))
    return path


def arguments(config: str, overrides: list[str], cfg: Config, **params: Any) -> dict[str, Any]:
    """Pipeline parameters: the config path, the user's overrides, the config's run-time values (iterations,
    staleness, evaluation and checkpoint cadence), and the non-empty extras."""
    opts = options_for(cfg, config)
    args: dict[str, Any] = {"config": config, "overrides": list(overrides), "iterations": opts.iterations,
                            "max_staleness": opts.max_staleness, "eval_every": opts.eval_every,
                            "checkpoint_every": opts.checkpoint_every}
    unknown = set(params) - set(RUNTIME_PARAMETERS)
    if unknown:
        raise LaunchError(f"unknown pipeline parameters {sorted(unknown)}; the parameters are {list(RUNTIME_PARAMETERS)}")
    args.update({k: v for k, v in params.items() if v not in ("", None)})
    return args


def run_local(config: str, overrides: list[str], cfg: Config, on_iteration: Any = None,
              options: PipelineOptions | None = None, **params: Any) -> dict[str, Any]:
    """Run the pipeline here: a local Ray cluster that the tasks join (``ray.address`` of ``cfg``, or a new one),
    ``kfp.local`` running each task as a subprocess. ``on_iteration(step, metrics)`` follows the run's iterations
    (as ``dockflow train``'s progress); ``params`` are the run-time parameters (``RUNTIME_PARAMETERS``).
    Returns the run's summary (what ``dockflow train`` writes too)."""
    import ray
    from kfp import local

    from dockflow.workers.cluster import connect, disconnect

    # Tasks run in other processes: give them absolute paths.
    overrides = [*overrides, f"run.output_dir={Path(cfg.run.output_dir).resolve()}",
                 f"sft.cache_dir={Path(cfg.sft.cache_dir).resolve()}"]
    config = str(Path(config).resolve())
    owns = connect(cfg.ray, f"dockflow-launcher-{cfg.run.name}")
    stop, found = threading.Event(), {}
    try:
        address = ray.get_runtime_context().gcs_address
        follower = threading.Thread(target=_follow_iterations, args=(_supervisors(), on_iteration, stop, found),
                                    daemon=True)
        follower.start()
        root = Path(cfg.run.output_dir).resolve() / "kfp"
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*non-Python base image.*", category=RuntimeWarning)
            try:
                build_pipeline(options or options_for(cfg, config))(
                    **arguments(config, overrides, cfg, ray_address=address, **params))
            except RuntimeError as exc:  # kfp.local's one line for a failed task; the task's log says why
                raise LaunchError(f"{' '.join(str(exc).split())}: see that task's log above") from None
    finally:
        stop.set()
        if owns:
            disconnect()
    summary = Path(cfg.run.output_dir).resolve() / found.get("run_name", "?") / "summary.json"
    if not summary.is_file():
        raise LaunchError(f"the pipeline finished but wrote no {summary}; see the finish task's log above")
    return json.loads(summary.read_text())


def _supervisors() -> dict[str, tuple[str, str]]:
    """The run supervisors on this cluster, by actor id (an id, not a name: a resubmitted run reuses its name)."""
    import ray

    out = {}
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a["name"].endswith(SUPERVISOR_SUFFIX):
            try:
                out[ray.get_actor(a["name"], namespace=a["namespace"])._actor_id.hex()] = (a["namespace"], a["name"])
            except ValueError:  # gone meanwhile
                pass
    return out


def _follow_iterations(known: dict[str, tuple[str, str]], on_iteration: Any, stop: threading.Event,
                       found: dict[str, str]) -> None:
    """Find the run's supervisor once setup has started it (the only new one on this launcher's cluster), then
    report each closed iteration (no heartbeat: only the pipeline's tasks keep a run alive)."""
    import ray

    sup = None
    while sup is None and not stop.is_set():
        new = {k: v for k, v in _supervisors().items() if k not in known}
        if new:
            namespace, name = sorted(new.values())[0]
            found["run_name"] = name.removesuffix(SUPERVISOR_SUFFIX)
            sup = ray.get_actor(name, namespace=namespace)
        else:
            time.sleep(0.5)
    cursor = 0
    while sup is not None and on_iteration is not None and not stop.is_set():
        try:
            out = ray.get(sup.follow.remote("iterations", cursor, False, 2.0), timeout=60)
        except ray.exceptions.RayActorError:  # Ray restarting it: follow it again from where it resumes
            time.sleep(1.0)
            try:
                sup, cursor = ray.get_actor(name, namespace=namespace), 0
            except ValueError:  # gone for good; the tasks report why
                return
            continue
        except Exception:  # noqa: BLE001 - the run ended; the tasks report why
            return
        cursor = out["cursor"]
        for event in out["events"]:
            on_iteration(event["index"], {**event["metrics"], "timing/iteration_s": event["seconds"]})
        if out["complete"] or out["phase"] in ("failed", "stopped", "finished"):
            return


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
    """Create a recurring run on a KFP host from the compiled ``package``; returns its id. Each run gets its own
    name from its KFP run id (unless ``run_name`` is given), and ``continue_from`` picks its starting model."""
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
        max_concurrency=1,  # a night's run builds on the previous night's model
        enable_caching=False,
    )
    return job.recurring_run_id


def default_package(cfg: Config) -> Path:
    return Path(cfg.run.output_dir) / f"{PIPELINE_NAME}.yaml"
