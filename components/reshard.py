"""The ``reshard`` component: one RL stage of one iteration."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Metrics, Output

from pipelines.platform import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def reshard(
    namespace: str, run_name: str, ray_address: str, iteration: int, metrics: Output[Metrics]
) -> NamedTuple("StageOutputs", mlflow_run_id=str, checkpoint_uri=str):
    """Move the updated weights from the update layout to the generation layout; close the iteration
    (Eq. 5 throughput, samples trained) and checkpoint when due.

    Logs the stage's metrics to the run's MLflow run (step iteration + 1) and to ``metrics``."""
    from dockflow.flow.tasks import kfp_outputs, run_stage

    return kfp_outputs(run_stage("reshard", namespace, run_name, ray_address, iteration), metrics)
