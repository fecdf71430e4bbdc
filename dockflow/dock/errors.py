"""The dock's exceptions and metadata keys, in a module without torch so that the dock's actors (warehouses,
controllers) start without importing it; ``api.py`` re-exports everything here."""

from __future__ import annotations

# Per-sample metadata the dock keeps beside the data (scalars, moved instead of data).
META_KEYS = ("prompt_id", "response_length", "policy_version", "age")


class DockError(RuntimeError):
    """Base class of transfer-dock failures."""


class DockTimeout(DockError):
    """A get could not be satisfied in time; the message names consumer, columns and readiness."""


class DockUnavailable(DockError):
    """A warehouse or controller died, or the dock could not be placed on the cluster."""


class DockInvalid(DockError, ValueError):
    """A put, get or reset that can never succeed: wrong shape, dtype, index, column or batch size."""
