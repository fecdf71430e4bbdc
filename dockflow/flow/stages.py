"""The RL stages: generate, infer, update, reshard, evaluate.

Each stage function launches its work on the run's workers and returns ``{name: ObjectRef}``; it never
touches sample data, only iteration numbers and prompt indices. The CLI loop (``dockflow.flow.sync``)
and the KFP components call these same functions; which driver called them is invisible here.
"""

from __future__ import annotations

from typing import Any

from dockflow.workers import Workers

Refs = dict[str, Any]


def generate(workers: Workers, iteration: int, prompt_ids: list[int]) -> Refs:
    """Sample N responses per prompt into the dock."""
    return {"generate": workers.actor.generate.remote(iteration, prompt_ids)}


def infer(workers: Workers, iteration: int) -> Refs:
    """Rewards, advantages, old log-probs and (with a KL penalty) reference log-probs, streamed off the dock."""
    refs = {
        "reward": workers.reward.compute_rewards.remote(iteration),
        "advantage": workers.reward.compute_advantages.remote(iteration),
        "old_log_prob": workers.actor.compute_old_log_prob.remote(iteration),
    }
    if workers.reference is not None:
        refs["ref_log_prob"] = workers.reference.compute_ref_log_prob.remote(iteration)
    return refs


def update(workers: Workers, iteration: int) -> Refs:
    """Policy update on the iteration's samples."""
    return {"update": workers.actor.update.remote(iteration)}


def reshard(workers: Workers, iteration: int) -> Refs:
    """Move the updated weights from the update layout to the generation layout."""
    return {"reshard": workers.actor.reshard.remote(iteration)}


def evaluate(workers: Workers, limit: int) -> Refs:
    """Greedy held-out accuracy of the current policy."""
    return {"evaluate": workers.actor.evaluate.remote("test", limit)}
