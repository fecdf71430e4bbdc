"""The ``finish`` component: the run's final model, summary and Model Registry decision."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Markdown, Metrics, Output

from pipelines.platform import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def finish(
    namespace: str, run_name: str, ray_address: str, metrics: Output[Metrics], report: Output[Markdown]
) -> NamedTuple("FinishOutputs", summary=str, final_model=str):
    """After every stage has done every iteration: stage the final model in the checkpoint store, write
    ``summary.json`` (the summary ``dockflow train`` writes) and log it to MLflow; with ``registry.model_name``
    register the final model and move the champion alias only if its held-out score beats the champion's by more
    than ``registry.champion_margin`` on the same evaluation (``dockflow.tracking.champion``). ``metrics`` and
    ``report`` say the scores, the evaluation's fingerprint, what was compared with what and the decision."""
    import json

    from dockflow.flow.pipeline_tasks import finish_run, kfp_metrics, run_report

    summary = finish_run(namespace, run_name, ray_address)
    kfp_metrics({k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                 and v is not None}, metrics)
    with open(report.path, "w") as f:
        f.write(run_report(summary))
    return json.dumps(summary), summary["final_model"]
