"""Bounded Ray calls whose failures come back as dock errors (DockUnavailable, DockTimeout, DockInvalid)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray

from dockflow.dock.errors import DockError, DockUnavailable


def unwrap(err: Exception, what: str) -> Exception:
    """The dock error a Ray exception stands for."""
    if isinstance(err, ray.exceptions.RayTaskError):
        cause = err.cause
        if isinstance(cause, DockError):
            return type(cause)(str(cause))
        if isinstance(cause, ray.exceptions.RayActorError):
            return DockUnavailable(f"{what}: a dock actor it depends on is dead: {cause}")
        return DockError(f"{what} failed: {cause!r}")
    if isinstance(err, ray.exceptions.RayActorError):
        return DockUnavailable(f"{what}: the dock actor is dead or unreachable ({type(err).__name__}: {err})")
    if isinstance(err, ray.exceptions.GetTimeoutError):
        return DockUnavailable(f"{what}: no answer in time ({err})")
    return err


def call(refs: Sequence[ray.ObjectRef], timeout_s: float, what: str) -> list[Any]:
    """``ray.get`` with a timeout, naming ``what`` in any failure."""
    try:
        return ray.get(list(refs), timeout=timeout_s)
    except (ray.exceptions.RayError, DockError) as err:
        raise unwrap(err, what) from None


def peer_id() -> str:
    """This process's Ray worker id, sent along with data so warehouses can say who moved which bytes."""
    return ray.get_runtime_context().get_worker_id()
