"""Each component: a typed lightweight component on the DockFlow image, with a docstring, that installs nothing
at run time and calls the ``dockflow.flow.tasks`` function of its stage (the kfp.local run is in
``tests/integration/test_pipeline_local.py``)."""

import inspect

import pytest

import components
from pipelines import platform

ALL = {"setup": components.setup, "teardown": components.teardown, **components.STAGE_COMPONENTS}


@pytest.mark.parametrize("name", sorted(ALL))
def test_component_runs_on_the_dockflow_image_without_installing(name):
    comp = ALL[name]
    container = comp.component_spec.implementation.container
    assert container.image == platform.DEFAULT_IMAGE
    assert "pip install" not in " ".join(container.command)  # the image already holds kfp and dockflow
    assert comp.description and len(comp.description) > 60


@pytest.mark.parametrize("name", sorted(components.STAGE_COMPONENTS))
def test_stage_component_interface_and_body(name):
    comp = components.STAGE_COMPONENTS[name]
    spec = comp.component_spec
    index = "step" if name == "evaluate" else "iteration"
    assert {k: v.type for k, v in spec.inputs.items()} == {
        "namespace": "String", "run_name": "String", "ray_address": "String", index: "Integer"
    }
    assert {k: v.type for k, v in spec.outputs.items()} == {
        "metrics": "system.Metrics@0.0.1", "mlflow_run_id": "String", "checkpoint_uri": "String"
    }
    source = inspect.getsource(comp.python_func)
    assert f'run_stage("{name}"' in source and "from dockflow.flow.tasks import" in source


def test_setup_and_teardown_interfaces():
    setup_in = set(components.setup.component_spec.inputs)
    assert setup_in == {"config", "overrides", "dag_overrides", "run_name", "ray_address", "mlflow_uri",
                        "s3_endpoint", "s3_bucket"}
    assert set(components.setup.component_spec.outputs) == {"namespace", "run_name", "mlflow_run_id", "checkpoint_uri"}
    teardown_in = components.teardown.component_spec.inputs
    assert teardown_in["status"].type == "PipelineTaskFinalStatus"
