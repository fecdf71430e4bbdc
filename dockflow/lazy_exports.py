"""A package's names imported on first use (PEP 562): ``__getattr__ = lazy_exports(__name__, EXPORTS)``.

``dockflow.dock`` and ``dockflow.engines`` export this way, so a process that needs one light submodule (a dock
actor, the reward worker) does not import the heavy ones beside it (torch, tensordict, the engines' backends).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: each name in ``exports`` (name -> its module) is imported from
    its module when first asked for."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
