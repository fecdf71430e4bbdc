"""Algorithms, one module each (its config section, worker states and columns, advantages and loss, and its tensor
functions), and the registry behind ``algorithm.name``::

    recipe = recipe_of(cfg.algorithm.name)      # or plan.recipe (dockflow.algos.plan.RunPlan)
    recipe.consumers(cfg); recipe.advantages(cfg, batch); recipe.policy_loss(cfg, logp, micro, tokens)

Shared pieces, one module each: ``base`` (``Algorithm``, the policy-gradient sections and columns), ``groups``
(group-normalised advantages, the informative-group filter), ``losses`` (the clipped ratio and surrogate),
``plan`` (the run plan), ``kl``, ``tis``, ``utils`` (masked tensor helpers).

Adding an algorithm is one module here (its section and its ``Algorithm``) and one entry in ``RECIPES``. Every
module imported here is light (pydantic only; torch inside the functions): ``dockflow/__init__.py`` imports this
package so that the algorithms are registered (``dockflow.config.algorithm.register_algorithm``) before any config
is validated, and loading a config must not import torch.
"""

from __future__ import annotations

from dockflow.algos import cispo, dapo, dpo, dr_grpo, grpo, gspo, pf_ppo, ppo, reinforce_pp, rloo
from dockflow.algos.base import Algorithm
from dockflow.config.algorithm import register_algorithm

RECIPES: dict[str, Algorithm] = {r.name: r for r in (
    grpo.GRPO(),
    ppo.PPO(),
    dapo.DAPO(),
    pf_ppo.PFPPO(),
    reinforce_pp.ReinforcePP(),
    reinforce_pp.ReinforcePPBaseline(),
    dpo.DPO(),
    gspo.GSPO(),
    rloo.RLOO(),
    dr_grpo.DrGRPO(),
    cispo.CISPO(),
)}
for recipe in RECIPES.values():
    register_algorithm(recipe)


def recipe_of(name: str) -> Algorithm:
    """The recipe of algorithm ``name``; a one-line error naming the known ones otherwise."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}: algorithm.name is one of {sorted(RECIPES)}") from None


__all__ = ["RECIPES", "Algorithm", "recipe_of"]
