"""Each component: a typed lightweight component on the DockFlow image, with a docstring, that installs nothing
at run time and calls the ``dockflow.flow.pipeline_tasks`` function of its step (the kfp.local runs are in
``tests/integration/test_pipeline_local.py``)."""

import inspect

import pytest

import components
from pipelines import platform

ALL = {"setup": components.setup, "finish": components.finish, "teardown": components.teardown,
       **components.STAGE_COMPONENTS}


@pytest.mark.parametrize("name", sorted(ALL))
def test_component_runs_on_the_dockflow_image_without_installing(name):
    comp = ALL[name]
    container = comp.component_spec.implementation.container
    assert container.image == platform.DEFAULT_IMAGE
    assert "pip install" not in " ".join(container.command)  # the image already holds kfp and dockflow
    assert comp.description and len(comp.description) > 60


@pytest.mark.parametrize("name", sorted(components.STAGE_COMPONENTS))
def test_stage_component_attaches_to_its_loop(name):
    comp = components.STAGE_COMPONENTS[name]
    spec = comp.component_spec
    assert {k: v.type for k, v in spec.inputs.items()} == {
        "namespace": "String", "run_name": "String", "ray_address": "String"
    }  # no iteration: the task follows its stage through every iteration
    assert {k: v.type for k, v in spec.outputs.items()} == {
        "metrics": "system.Metrics@0.0.1", "mlflow_run_id": "String", "checkpoint_uri": "String"
    }
    source = inspect.getsource(comp.python_func)
    assert f'follow_stage("{name}"' in source and "from dockflow.flow.pipeline_tasks import" in source


def test_setup_finish_and_teardown_interfaces():
    setup_in = {k: v.type for k, v in components.setup.component_spec.inputs.items()}
    assert setup_in == {
        "config": "String", "overrides": "List", "run_name": "String", "job_id": "String", "iterations": "Integer",
        "max_staleness": "Integer", "eval_every": "Integer", "checkpoint_every": "Integer", "continue_from": "String",
        "ray_address": "String", "mlflow_uri": "String", "s3_endpoint": "String", "s3_bucket": "String",
    }
    assert {k: v.type for k, v in components.setup.component_spec.outputs.items()} == {
        "run_link": "system.Markdown@0.0.1", "namespace": "String", "run_name": "String", "mlflow_run_id": "String",
        "checkpoint_uri": "String",
    }
    assert set(components.finish.component_spec.outputs) == {"metrics", "report", "summary", "final_model"}
    teardown_in = components.teardown.component_spec.inputs
    assert teardown_in["status"].type == "PipelineTaskFinalStatus"
    assert set(teardown_in) == {"config", "overrides", "run_name", "job_id", "ray_address", "status"}
