"""The ``teardown`` component: the pipeline's exit task."""

from kfp import dsl
from kfp.dsl import PipelineTaskFinalStatus

from pipelines.platform import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def teardown(config: str, overrides: list, run_name: str, job_id: str, ray_address: str,
             status: PipelineTaskFinalStatus) -> None:
    """Runs whether the pipeline succeeded or not: closes the MLflow run (FINISHED when it succeeded, else FAILED)
    and kills the run's supervisor with the workers and dock it owns. It finds the run from the same config,
    overrides, run name and job id that setup got (an exit task cannot read setup's outputs)."""
    from dockflow.flow.pipeline_tasks import RunParams, teardown_run

    params = RunParams(run_name=run_name, job_id=job_id)
    teardown_run(config, list(overrides), params, ray_address, succeeded=status.state == "SUCCEEDED")
