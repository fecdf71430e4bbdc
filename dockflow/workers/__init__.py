"""Ray actors, one class per role of the run plan (``group.py: WORKER_CLASSES``): actor (the policy: generate,
infer, update, reshard), generator (disaggregated generation), rollout queue (the generators' shared work,
``dockflow.rollout.queue``), reference, critic, reward (scores, then the advantage state), reward model, and the
preference pair source. They exchange samples only through the transfer dock; the driver sends iteration numbers
and prompt indices. Generation into the dock is ``dockflow.rollout``'s.

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
