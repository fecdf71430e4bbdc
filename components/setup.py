"""The ``setup`` component: create the run's dock, workers and ledger on the Ray cluster."""

from typing import NamedTuple

from kfp import dsl

from pipelines.platform import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def setup(
    config: str,
    overrides: list,
    dag_overrides: list,
    run_name: str,
    ray_address: str,
    mlflow_uri: str,
    s3_endpoint: str,
    s3_bucket: str,
) -> NamedTuple("SetupOutputs", namespace=str, run_name=str, mlflow_run_id=str, checkpoint_uri=str):
    """Load ``config`` (a YAML path in the image) with dotted ``overrides`` (the user's), then ``dag_overrides``
    (iterations, staleness and evaluation steps the DAG was compiled for, so the run agrees with it); warm-start the model (SFT, cached);
    start the MLflow run; create the transfer dock, the workers and the run ledger as named detached Ray actors
    in a namespace named after the run, on the cluster at ``ray_address`` (empty: ``$RAY_ADDRESS``).

    Empty ``run_name``, ``mlflow_uri``, ``s3_endpoint`` or ``s3_bucket`` keep what the config (or the env) says;
    ``s3_bucket`` sends checkpoints to ``s3://<bucket>/<run_name>``."""
    from dockflow.flow.tasks import platform_overrides
    from dockflow.flow.tasks import setup as setup_run

    extra = platform_overrides(run_name, mlflow_uri, s3_endpoint, s3_bucket)
    out = setup_run(config, [*overrides, *dag_overrides, *extra], ray_address)
    return out["namespace"], out["run_name"], out["mlflow_run_id"], out["checkpoint_uri"]
