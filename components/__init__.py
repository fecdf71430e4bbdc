"""KFP v2 lightweight components, one per RL stage plus setup, finish and teardown; each is a thin wrapper over
``dockflow.flow.pipeline_tasks``.

The function bodies run inside the DockFlow image (``pipelines.platform.DEFAULT_IMAGE``, built by the
top-level Dockerfile), which already holds kfp and dockflow, so no package is installed at run time.
"""

from components.evaluate import evaluate
from components.finish import finish
from components.generate import generate
from components.infer import infer
from components.reshard import reshard
from components.setup import setup
from components.teardown import teardown
from components.update import update

STAGE_COMPONENTS = {"generate": generate, "infer": infer, "update": update, "reshard": reshard, "evaluate": evaluate}

__all__ = ["STAGE_COMPONENTS", "evaluate", "finish", "generate", "infer", "reshard", "setup", "teardown", "update"]
