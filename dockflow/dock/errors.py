"""The dock's exceptions and metadata keys, in a module without torch so that the dock's actors (warehouses,
controllers) start without importing it; ``api.py`` re-exports everything here."""

from __future__ import annotations

# Per-sample metadata the dock keeps beside the data (scalars, moved instead of data).
META_KEYS = ("prompt_id", "response_length", "policy_version", "age")


class DockError(RuntimeError):
    """Base class of transfer-dock failures."""


class DockTimeout(DockError):
    """A get could not be satisfied in time; the message names consumer, columns and readiness."""


class DockCancelled(DockError):
    """A waiting get was cancelled by a reset: the iteration it waited for is over (e.g. its producer died)."""


def get_failure(status: str, message: str) -> DockError:
    """The client-side exception of a get that a dock actor answered with a non-"ok" status."""
    return DockCancelled(message) if status == "reset" else DockTimeout(message)


class DockUnavailable(DockError):
    """A warehouse or controller died, or the dock could not be placed on the cluster."""


class DockInvalid(DockError, ValueError):
    """A put, get or reset that can never succeed: wrong shape, dtype, index, column or batch size."""
