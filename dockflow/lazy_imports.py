"""Optional imports of Transformers that DockFlow never calls, deferred to their first call.

Whenever scikit-learn and SciPy are installed (MLflow requires both), importing a Transformers model imports them:
``transformers.generation.candidate_generator`` binds ``sklearn.metrics.roc_curve`` (assisted generation's confidence
threshold) and the object-detection losses (``transformers.loss.loss_*``) bind ``scipy.optimize.linear_sum_assignment``,
at import. That costs every process that loads a model (each Ray worker, KFP task and CLI run) about 2.3 s of CPU
here (``python -X importtime -c "import dockflow.workers.actor"``: sklearn, pandas, scipy.optimize), for functions no
DockFlow code path calls.

``install()`` (run by ``import dockflow``) has those modules bind a forwarder of the same name instead: while one of
them executes, Transformers' availability probe for its package answers False, so the module skips that import;
then the module gets its real probe back and, when the package is installed, a forwarder that imports the function
on its first call and calls it. Same names, same results; only a process that calls one pays for the import. A
Transformers release that moves these names only loses the saving (the module is executed as it is). The probe is
swapped only while that one module executes, which happens once per process, while a model's modules import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from collections.abc import Callable
from typing import Any

# module -> (its availability probe in transformers.utils, the package module it imports from, the names it binds)
DEFERRED: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "transformers.generation.candidate_generator": ("is_sklearn_available", "sklearn.metrics", ("roc_curve",)),
    **{f"transformers.loss.{name}": ("is_scipy_available", "scipy.optimize", ("linear_sum_assignment",))
       for name in ("loss_for_object_detection", "loss_deformable_detr", "loss_rt_detr", "loss_rf_detr",
                    "loss_grounding_dino", "loss_lw_detr")},
}


def forwarder(module: str, name: str) -> Callable[..., Any]:
    """``module.name`` imported on the first call, then called with the same arguments."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``{module}.{name}``, imported on first use (dockflow.lazy_imports)."
    return call


class DeferringLoader(importlib.abc.Loader):
    """Executes one module of ``DEFERRED`` with its probe answering False, then binds the forwarders."""

    def __init__(self, inner: Any, probe: str, source: str, names: tuple[str, ...]) -> None:
        self.inner, self.probe, self.source, self.names = inner, probe, source, names

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        utils = importlib.import_module("transformers.utils")
        real = getattr(utils, self.probe, None)
        if real is None:  # another Transformers layout: nothing to defer
            self.inner.exec_module(module)
            return
        setattr(utils, self.probe, lambda: False)
        try:
            self.inner.exec_module(module)
        finally:
            setattr(utils, self.probe, real)
        if getattr(module, self.probe, None) is not None:
            setattr(module, self.probe, real)
        if real():
            for name in self.names:
                if not hasattr(module, name):
                    setattr(module, name, forwarder(self.source, name))


class DeferringFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of ``DEFERRED`` with the other finders and gives them a ``DeferringLoader``."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in DEFERRED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = DeferringLoader(spec.loader, *DEFERRED[fullname])
                return spec
        return None


def install() -> None:
    """Add the finder in front of the others (once); the modules already imported keep what they bound."""
    if not any(isinstance(f, DeferringFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, DeferringFinder())
