"""Ray actors that hold the models: actor (policy), reference, reward, critic. They exchange samples only
through the transfer dock; the driver sends iteration numbers and prompt indices.

Names are imported lazily (PEP 562): a pipeline task that only needs ``workers.cluster`` must not import
torch and transformers through the worker classes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dockflow.workers.group import Workers, WorkerStartError, create_workers, kill_workers

__all__ = ["WorkerStartError", "Workers", "create_workers", "kill_workers"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("dockflow.workers.group"), name)
    raise AttributeError(f"module 'dockflow.workers' has no attribute {name!r}")
