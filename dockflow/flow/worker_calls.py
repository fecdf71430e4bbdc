"""The RL stages: generate, score, infer, update, reshard, evaluate.

Each stage function launches its work on the run's workers and returns ``{name: ObjectRef}``; it never
touches sample data, only iteration numbers and prompt indices. The stage loops (``dockflow.flow.iteration``)
call these, in ``dockflow train`` and in a pipeline run alike; which driver runs them is invisible here. A stage
asks only the workers the algorithm has (``Workers`` fields are None otherwise).
"""

from __future__ import annotations

from typing import Any

from dockflow.workers import Workers

Refs = dict[str, Any]


def generate(
    workers: Workers, iteration: int, prompt_ids: list[int], first_index: int = 0, offline: bool = False,
    group_size: int = 1, weights: Any = None,
) -> Refs:
    """Sample N (``group_size``) responses per prompt into the dock from index ``first_index`` on; ``offline``
    (DPO) puts the preference pairs ``prompt_ids`` instead. With several generator workers (disaggregated
    placement) each takes chunks of prompts from the run's rollout queue on demand and writes the chunk's fixed
    slice of the window (``dockflow.workers.rollout_queue``); generator workers first take ``weights`` (a policy
    ``publish`` put in the object store) when it is newer than theirs."""
    if offline:
        return {"generate": workers.pairs.put_pairs.remote(iteration, prompt_ids)}
    if not workers.generators:
        return _generate_on_actor_ranks(workers, iteration, prompt_ids, first_index, group_size)
    if len(workers.generators) == 1:
        return {"generate/0": workers.generators[0].generate.remote(iteration, prompt_ids, first_index, weights=weights)}
    # Several generators draw chunks from one queue as they go: a faster one takes more.
    opened = workers.rollout_queue.open.remote(iteration, prompt_ids)
    return {
        f"generate/{k}": g.generate.remote(iteration, prompt_ids, first_index, workers.rollout_queue, k, opened,
                                           weights=weights)
        for k, g in enumerate(workers.generators)
    }


def _generate_on_actor_ranks(workers: Workers, iteration: int, prompt_ids: list[int], first_index: int,
                             group_size: int) -> Refs:
    """Colocated: the actor generates; with train.dp >= 2 each rank a fixed contiguous share of the prompts,
    written to the matching slice of the window (rank k's result is ``generate/k``)."""
    ranks = actor_ranks(workers)
    if len(ranks) == 1:
        return {"generate": workers.actor.generate.remote(iteration, prompt_ids, first_index)}
    refs: Refs = {}
    for k, (lo, hi) in enumerate(shares(len(prompt_ids), len(ranks))):
        refs[f"generate/{k}"] = ranks[k].generate.remote(iteration, prompt_ids[lo:hi], first_index + lo * group_size)
    return refs


def actor_ranks(workers: Workers) -> list[Any]:
    """Every actor rank's handle (train.actor_ranks: dp x tp x pp); a bare handle set without ``actors`` has one."""
    return getattr(workers, "actors", None) or [workers.actor]


def on_actor_ranks(workers: Workers, stage: str, method: str, *args: Any) -> Refs:
    """Call ``method`` on every actor rank (collective with several): ``stage`` for rank 0, ``stage/k`` for rank k;
    their metrics merge (rank 0 reports the stage's, over every rank's share; the others only their own
    ``memory/rank<k>/...``)."""
    ranks = actor_ranks(workers)
    return {stage if k == 0 else f"{stage}/{k}": getattr(a, method).remote(*args) for k, a in enumerate(ranks)}


def critic_ranks(workers: Workers) -> list[Any]:
    """Every critic rank's handle (tp x pp with megatron, else one; none without a critic)."""
    if workers.critic is None:
        return []
    return getattr(workers, "critics", None) or [workers.critic]


def on_critic_ranks(workers: Workers, stage: str, method: str, *args: Any) -> Refs:
    """Call ``method`` on every critic rank (collective with megatron): ``stage`` for rank 0, ``stage/k`` for rank
    k; only rank 0 reports metrics (the others return none)."""
    ranks = critic_ranks(workers)
    return {stage if k == 0 else f"{stage}/{k}": getattr(c, method).remote(*args) for k, c in enumerate(ranks)}


def shares(n: int, parts: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of each of ``parts`` contiguous, near-equal shares of ``n`` items (earlier ones larger)."""
    size, extra = divmod(n, parts)
    bounds = [0]
    for k in range(parts):
        bounds.append(bounds[-1] + size + (k < extra))
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def score(workers: Workers, iteration: int, round_index: int = 0, last_round: bool = True) -> Refs:
    """Rewards and advantages of one generation round, streamed off the dock (none for DPO); with reward models,
    their scores too, beside the rewards (the reward state waits in the dock for them)."""
    if workers.reward is None:
        return {}
    refs = {
        "reward": workers.reward.compute_rewards.remote(iteration),
        "advantage": workers.reward.compute_advantages.remote(iteration, round_index, last_round),
    }
    if workers.reward_model is not None:
        refs["reward_model"] = workers.reward_model.score.remote(iteration)
    return refs


def infer(workers: Workers, iteration: int, offline: bool = False) -> Refs:
    """Model inferences: old log-probs, reference log-probs and critic values, for the workers that exist."""
    refs = {} if offline else on_actor_ranks(workers, "old_log_prob", "compute_old_log_prob", iteration)
    if workers.reference is not None:
        refs["ref_log_prob"] = workers.reference.compute_ref_log_prob.remote(iteration)
    refs.update(on_critic_ranks(workers, "values", "compute_values", iteration))
    return refs


def update(workers: Workers, iteration: int) -> Refs:
    """Policy (and critic) update on the iteration's samples."""
    refs = on_actor_ranks(workers, "update", "update", iteration)
    refs.update(on_critic_ranks(workers, "critic_update", "update", iteration))
    return refs


def reshard(workers: Workers, iteration: int) -> Refs:
    """Colocated: move the updated weights from the update layout to the actor's generation layout (allgather-swap
    with train.dp >= 2). Disaggregated placement publishes them instead (``publish``)."""
    return on_actor_ranks(workers, "reshard", "reshard")


def publish(workers: Workers) -> tuple[Any, Any]:
    """Disaggregated: the actor's current weights, once into the object store for every generator worker.
    Returns (ref of the metrics with the ``policy_version``, ref of the weights: pass it on, never fetch it)."""
    return workers.actor.publish_weights.options(num_returns=2).remote()


def evaluate(workers: Workers, limit: int) -> Refs:
    """Held-out scores of the current policy (actor rank 0, on its unsharded generation copy); offline algorithms
    add the margin on the pair source's held-out pairs (passed worker to worker, not through the driver)."""
    pairs = workers.pairs.eval_pairs.remote() if workers.pairs is not None else None
    return {"evaluate": workers.actor.evaluate.remote("test", limit, pairs)}
