"""The base of every config section: unknown keys are errors, assignments are validated.

It lives apart from ``dockflow.config`` so that the algorithms' recipes (``dockflow.algos.recipes``), whose
sections ``Config`` is made of, can build on it without importing the config itself.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
