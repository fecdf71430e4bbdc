"""The algorithm registry: every recipe DockFlow runs, by ``algorithm.name``.

    recipe = recipe_of(cfg.algorithm.name)      # or cfg.algorithm.recipe
    recipe.consumers(cfg); recipe.advantages(cfg, batch); recipe.policy_loss(cfg, logp, micro, tokens)

Adding an algorithm is one module here (its section and its ``Algorithm``) and one line in ``RECIPES``.
"""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from dockflow.algos.recipe import Algorithm
from dockflow.algos.recipes.dapo import DAPO
from dockflow.algos.recipes.dpo import DPO
from dockflow.algos.recipes.dr_grpo import DrGRPO
from dockflow.algos.recipes.grpo import GRPO
from dockflow.algos.recipes.gspo import GSPO
from dockflow.algos.recipes.pf_ppo import PFPPO
from dockflow.algos.recipes.ppo import PPO
from dockflow.algos.recipes.reinforce_pp import ReinforcePP, ReinforcePPBaseline
from dockflow.algos.recipes.rloo import RLOO

RECIPES: dict[str, Algorithm] = {
    r.name: r for r in (GRPO(), PPO(), DAPO(), PFPPO(), ReinforcePP(), ReinforcePPBaseline(), DPO(), GSPO(), RLOO(), DrGRPO())
}

# The config's ``algorithm:`` section: one model per algorithm, picked by ``name`` (pydantic's discriminated union).
_SECTIONS = tuple(dict.fromkeys(r.section for r in RECIPES.values()))
AlgorithmConfig = Annotated[Union[_SECTIONS], Field(discriminator="name")]  # noqa: UP007 - a runtime tuple of types


def recipe_of(name: str) -> Algorithm:
    """The recipe of algorithm ``name``; a one-line error naming the known ones otherwise."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}: algorithm.name is one of {sorted(RECIPES)}") from None


__all__ = ["RECIPES", "AlgorithmConfig", "recipe_of"]
