"""The ``generate`` component: one RL stage of one iteration."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Metrics, Output

from pipelines.platform import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def generate(
    namespace: str, run_name: str, ray_address: str, iteration: int, metrics: Output[Metrics]
) -> NamedTuple("StageOutputs", mlflow_run_id=str, checkpoint_uri=str):
    """Sample N responses for each of the iteration's G prompts into the dock, then rewards and advantages
    (streamed behind generation; DAPO's dynamic sampling runs its rounds here).

    Logs the stage's metrics to the run's MLflow run (step iteration + 1) and to ``metrics``."""
    from dockflow.flow.tasks import kfp_outputs, run_stage

    return kfp_outputs(run_stage("generate", namespace, run_name, ray_address, iteration), metrics)
