"""The base of every config section: unknown keys are errors, assignments are validated; ``flatten_dict``.

It lives apart from ``dockflow.config.run`` so that the algorithms' sections (``dockflow.algos``: one module per
algorithm) can build on it without importing ``Config``.
"""

from __future__ import annotations

from collections.abc import Mapping
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
