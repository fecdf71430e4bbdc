"""Importing the user's own code by ``module:attribute`` path (reward functions, tools, environments), with one
error line that names the path and what to do."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def import_user_callable(path: str, kind: str, error: type[Exception], noun: str = "function") -> Callable[..., Any]:
    """The callable at ``module:attribute``; ``error`` with a line naming ``kind`` and ``path`` when the module
    cannot be imported or has no such callable (``noun`` names what was looked for)."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure of the user's module is reported the same way
        raise error(
            f"{kind} {path!r}: cannot import module {module_name!r} ({type(exc).__name__}: {exc}); put it on "
            "PYTHONPATH (or install it) where the run starts"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise error(f"{kind} {path!r}: module {module_name!r} has no {noun} {attr!r}")
    return fn
