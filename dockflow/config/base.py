"""The base of every config section: unknown keys are errors, assignments are validated; ``flatten_dict``;
``renamed_key``: the one line for a key that was replaced, saying what to write instead.

It lives apart from ``dockflow.config.run`` so that the algorithms' sections (``dockflow.algos``: one module per
algorithm) can build on it without importing ``Config``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def flatten_dict(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> ``{"a.b.c": value}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten_dict(v, key + "."))
        else:
            out[key] = v
    return out


def _tis_cap(value: Any) -> str:
    group = "{mode: null}" if value is None else f"{{mode: token_truncate, cap: {value}}}"
    return (f"train.tis_cap was replaced by the train.rollout_correction group: write rollout_correction: {group} "
            "under train (token_truncate is what tis_cap did; docs/algorithms.md, Rollout correction)")


# A replaced dotted key -> the one line saying what to write instead, given the value the config wrote.
RENAMED: dict[str, Callable[[Any], str]] = {"train.tis_cap": _tis_cap}


def renamed_key(raw: Mapping[str, Any]) -> str | None:
    """The line for the first replaced key ``raw`` (a nested config) writes, or None."""
    flat = flatten_dict(raw)
    return next((RENAMED[k](flat[k]) for k in flat if k in RENAMED), None)
