"""The ``teardown`` component: the pipeline's exit task."""

from kfp import dsl
from kfp.dsl import PipelineTaskFinalStatus

from pipelines.platform import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def teardown(config: str, overrides: list, run_name: str, ray_address: str, status: PipelineTaskFinalStatus) -> str:
    """Runs whether the pipeline succeeded or not. On success: save the final model, write ``summary.json`` and
    log it to MLflow. Always: close the MLflow run (FINISHED or FAILED) and kill the run's actors. Returns the
    summary as JSON ("{}" when the run failed)."""
    import json

    from dockflow.flow.tasks import teardown_run

    summary = teardown_run(config, overrides, run_name, ray_address, succeeded=status.state == "SUCCEEDED")
    return json.dumps(summary)
