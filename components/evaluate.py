"""The ``evaluate`` component: attaches to the run's evaluate loop on the Ray cluster and follows it to the end."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Metrics, Output

from pipelines.platform import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def evaluate(
    namespace: str, run_name: str, ray_address: str, metrics: Output[Metrics]
) -> NamedTuple("StageOutputs", mlflow_run_id=str, checkpoint_uri=str):
    """Held-out scores (greedy accuracy; pass@k, DPO's margin where configured) before RL, every
    ``eval.every`` iterations and at the end.

    The loop runs in the run's supervisor actor; this task prints its progress, ends when it has done every
    iteration (or fails with its error; a retry restarts the run from its latest checkpoint), and writes the
    stage's metrics (mean per key over the iterations) to ``metrics``."""
    from dockflow.flow.pipeline_tasks import follow_stage, kfp_metrics

    out = follow_stage("evaluate", namespace, run_name, ray_address)
    kfp_metrics(out["metrics"], metrics)
    return out["mlflow_run_id"], out["checkpoint_uri"]
