"""The ``setup`` component: name the run, stage its initial model, and start its stage loops on the Ray cluster."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Markdown, Output

from pipelines.platform import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def setup(
    config: str,
    overrides: list,
    *,
    run_name: str,
    job_id: str,
    iterations: int,
    max_staleness: int,
    eval_every: int,
    checkpoint_every: int,
    continue_from: str,
    ray_address: str,
    mlflow_uri: str,
    s3_endpoint: str,
    s3_bucket: str,
    run_link: Output[Markdown],
) -> NamedTuple("SetupOutputs", namespace=str, run_name=str, mlflow_run_id=str, checkpoint_uri=str):
    """Load ``config`` (a YAML path in the image) with the user's dotted ``overrides``, then the run-time
    parameters (``iterations``, ``max_staleness``, ``eval_every``, ``checkpoint_every``, ``continue_from``: base,
    latest or champion). The run is named ``run_name``, or after the config and ``job_id`` (the KFP run's id);
    an explicit name with checkpoints resumes the run, after killing what an earlier attempt left alive.
    Stage the initial model in the checkpoint store (SFT warm start, cached; or a registered model), open the
    MLflow run, start the run's supervisor on the Ray cluster at ``ray_address`` (empty: ``$RAY_ADDRESS``), and
    write a Markdown link to the MLflow run. Empty ``mlflow_uri``, ``s3_endpoint``, ``s3_bucket`` keep the env
    or the config; ``s3_bucket`` puts checkpoints under ``s3://<bucket>/<run name>``."""
    from dockflow.flow.pipeline_tasks import RunParams, mlflow_link
    from dockflow.flow.pipeline_tasks import setup as setup_run

    params = RunParams(run_name=run_name, job_id=job_id, iterations=iterations, max_staleness=max_staleness,
                       eval_every=eval_every, checkpoint_every=checkpoint_every, continue_from=continue_from,
                       mlflow_uri=mlflow_uri, s3_endpoint=s3_endpoint, s3_bucket=s3_bucket)
    out = setup_run(config, list(overrides), params, ray_address)
    with open(run_link.path, "w") as f:
        f.write(f"# DockFlow run `{out['run_name']}`\n\n{mlflow_link(out['tracking_uri'], out['experiment_id'], out['mlflow_run_id'])}\n\n"
                f"Checkpoints: `{out['checkpoint_uri']}`; resumed from iteration {out['resumed_from']}.\n")
    return out["namespace"], out["run_name"], out["mlflow_run_id"], out["checkpoint_uri"]
