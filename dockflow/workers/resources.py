"""What each worker asks Ray for, and the run plan built once with it.

    plan = build_plan(cfg)     # the driver, once per run: the algorithm's roles (Algorithm.plan), sized here

The algorithm says which roles a run has and which columns they read and write (``dockflow.algos.plan.plan_roles``);
the CPUs and accelerators of each worker come from ``ray:``, ``placement:``, ``reward:`` and ``engine:``
(``role_cpus``, ``devices_per_worker``). Light (no torch, no Ray): the pipeline's setup task imports it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from dockflow.algos import recipe_of
from dockflow.algos.plan import MODEL_ROLES, RunPlan

if TYPE_CHECKING:
    from dockflow.config import Config


def role_cpus(cfg: Config, name: str, count: int) -> float:
    """Ray CPUs one worker of role ``name`` (of ``count``) asks for: ``ray.actor_cpus`` (``ray.critic_cpus``) is
    the whole actor's (critic's), shared by its ranks; generators ``placement.generator_cpus``; the reference
    ``ray.reference_cpus``; reward models ``reward.model_cpus``; the rest (reward, pairs, queue) none."""
    ray = cfg.ray
    cpus = {"actor": ray.actor_cpus / max(count, 1), "critic": ray.critic_cpus / max(count, 1),
            "generator": cfg.placement.generator_cpus, "reference": ray.reference_cpus,
            "reward_model": cfg.reward.model_cpus}
    return cpus.get(name, 0.0)


def devices_per_worker(cfg: Config, role: str) -> float:
    """Accelerators one worker of ``role`` holds: a generating worker (actor, generator) on the vLLM backend holds
    ``engine.vllm.tensor_parallel_size`` (the generation layout's TP; training uses the first); the reward-model
    worker ``reward.model_devices`` (a fraction shares one); other model workers 1; the rest none."""
    if cfg.engine.device == "cpu":
        return 0
    if role == "reward_model":
        return cfg.reward.model_devices
    if role not in MODEL_ROLES:
        return 0
    if role in ("actor", "generator") and cfg.engine.backend == "vllm":
        return int(cfg.engine.vllm.tensor_parallel_size)
    return 1


def size_roles(cfg: Config, plan: RunPlan) -> RunPlan:
    """``plan`` with each role's CPUs and devices per worker."""
    roles = {name: replace(r, cpus=role_cpus(cfg, name, r.count), devices=devices_per_worker(cfg, name))
             for name, r in plan.roles.items()}
    return replace(plan, roles=roles)


def build_plan(cfg: Config) -> RunPlan:
    """The run plan of ``cfg``: its algorithm's roles, columns and sampling (``Algorithm.plan``), sized. The
    driver builds it once and passes it to the workers and the flow."""
    return size_roles(cfg, recipe_of(cfg.algorithm.name).plan(cfg))
