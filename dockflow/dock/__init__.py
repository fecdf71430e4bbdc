"""The transfer dock: the sample flow between worker states (MindSpeed RL's distributed transfer dock).

Workers import only this package: ``create_dock(DockSpec(...))`` returns a picklable ``TransferDock`` client
for the distributed backend (warehouses + controllers) or the centralized baseline.

Names are imported lazily (PEP 562) so that the dock's actors, which import submodules of this package,
do not pay for torch and tensordict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dockflow.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from dockflow.dock.api import (
        META_KEYS,
        DockBatch,
        DockCancelled,
        DockError,
        DockInvalid,
        DockSpec,
        DockTimeout,
        DockUnavailable,
        TransferDock,
    )
    from dockflow.dock.netmodel import LinkSpec
    from dockflow.dock.partition import balanced_partitions
    from dockflow.dock.request import DockRequest

_EXPORTS = {
    "META_KEYS": "dockflow.dock.errors",
    "DockCancelled": "dockflow.dock.errors",
    "DockError": "dockflow.dock.errors",
    "DockInvalid": "dockflow.dock.errors",
    "DockTimeout": "dockflow.dock.errors",
    "DockUnavailable": "dockflow.dock.errors",
    "DockBatch": "dockflow.dock.api",
    "DockRequest": "dockflow.dock.request",
    "DockSpec": "dockflow.dock.api",
    "TransferDock": "dockflow.dock.api",
    "balanced_partitions": "dockflow.dock.partition",
}


__getattr__ = lazy_exports(__name__, _EXPORTS)


def create_dock(spec: DockSpec, link: LinkSpec | None = None) -> TransferDock:
    """Start the dock's actors on the current Ray cluster (``ray.init`` first) and return its client.
    ``link``: benchmarks only, the paper's bandwidth model (``netmodel.py``: one modelled link per node, shared by
    the node's dock processes); None (what a run passes) = off, the dock as it runs for real."""
    if spec.backend == "centralized":
        from dockflow.dock.centralized import CentralizedDock

        return CentralizedDock.create(spec, link)
    from dockflow.dock.distributed import DistributedDock

    return DistributedDock.create(spec, link)


__all__ = [
    "META_KEYS",
    "DockBatch",
    "DockCancelled",
    "DockError",
    "DockInvalid",
    "DockRequest",
    "DockSpec",
    "DockTimeout",
    "DockUnavailable",
    "TransferDock",
    "balanced_partitions",
    "create_dock",
]
