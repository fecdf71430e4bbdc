"""The ``evaluate`` component: held-out scores of the current policy."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Metrics, Output

from pipelines.platform import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def evaluate(
    namespace: str, run_name: str, ray_address: str, step: int, metrics: Output[Metrics]
) -> NamedTuple("EvalOutputs", mlflow_run_id=str, checkpoint_uri=str):
    """Greedy held-out accuracy (and pass@k, DPO margin where configured) after ``step`` iterations (0: before
    RL), logged to MLflow at ``step`` and to ``metrics``; checkpoints when one is due at ``step``."""
    from dockflow.flow.tasks import kfp_outputs, run_stage

    return kfp_outputs(run_stage("evaluate", namespace, run_name, ray_address, step), metrics)
