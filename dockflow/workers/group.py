"""Create the run plan's workers (``RunPlan.roles``, the plan the driver built once) as named Ray actors and wait until they are up: placed within
``ray.init_timeout_s``, started within ``ray.engine_init_timeout_s`` of placement (``dockflow.workers.startup``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dockflow.algos.plan import Role, RunPlan
from dockflow.config import Config
from dockflow.dock import TransferDock
from dockflow.engines.devices import check_cluster_devices, device_resources
from dockflow.rollout.queue import RolloutQueue, queue_settings
from dockflow.workers.actor import ActorWorker
from dockflow.workers.critic import CriticWorker
from dockflow.workers.generator import GeneratorWorker
from dockflow.workers.pairs import PairSource
from dockflow.workers.reference import ReferenceWorker
from dockflow.workers.reward import RewardWorker
from dockflow.workers.reward_model import RewardModelWorker
from dockflow.workers.run_dock import run_dock_name
from dockflow.workers.startup import (
    StartLimits,
    WorkerStartError,
    check_cluster_cpus,
    wait_ready,
    worker_cpus,
    worker_label,
)

# the class each role of the plan runs (``dockflow.algos.plan.ROLES``)
WORKER_CLASSES: dict[str, type] = {
    "actor": ActorWorker, "generator": GeneratorWorker, "rollout_queue": RolloutQueue, "reference": ReferenceWorker,
    "critic": CriticWorker, "reward": RewardWorker, "reward_model": RewardModelWorker, "pairs": PairSource,
}


@dataclass
class Workers:
    """Handles of the run's Ray actors; a role the run does not have is None (or an empty list)."""

    actors: list[Any]  # every actor rank (train.actor_ranks: dp x tp x pp); rank 0 evaluates and publishes
    reward: Any | None = None  # algorithms that sample (not offline ones)
    reference: Any | None = None  # offline algorithms (DPO), or a KL penalty
    critics: list[Any] = field(default_factory=list)  # every critic rank (train.critic_ranks): PPO, PF-PPO
    reward_model: Any | None = None  # with reward.models: scores rollouts into rm_scores (workers/reward_model.py)
    pairs: Any | None = None  # offline algorithms: the preference pairs' source
    generators: list[Any] = field(default_factory=list)  # placement.mode=disaggregated
    rollout_queue: Any | None = None  # several generators: the chunks they draw from (rollout/queue.py)
    prefix: str = ""  # the actors are named "<prefix>-<role>"

    @property
    def actor(self) -> Any:
        """Actor rank 0: the one that evaluates, publishes weights and saves the final model."""
        return self.actors[0]

    @property
    def critic(self) -> Any | None:
        """Critic rank 0 (None without a critic)."""
        return self.critics[0] if self.critics else None

    def all(self) -> dict[str, Any]:
        named = {"actor": self.actor, "reward": self.reward, "reference": self.reference, "critic": self.critic,
                 "pairs": self.pairs}
        named.update({f"actor-{k}": a for k, a in enumerate(self.actors) if k > 0})
        named.update({f"critic-{k}": c for k, c in enumerate(self.critics) if k > 0})
        named.update({f"generator-{k}": g for k, g in enumerate(self.generators)})
        named["rollout-queue"] = self.rollout_queue
        named["reward-model"] = self.reward_model
        return {k: v for k, v in named.items() if v is not None}


def building(cfg: Config, plan: RunPlan) -> dict[str, str]:
    """Worker label -> what it builds while it starts (the start-up timeout names it)."""
    engines = (f"its model and engines (engine.backend={cfg.engine.backend} generation, train.engine={cfg.train.engine} "
               f"training) on {cfg.engine.device}")
    what = {"actor": engines, "generator": f"its model and {cfg.engine.backend} generation engine on {cfg.engine.device}",
            "reference": f"the reference model on {cfg.engine.device}",
            "critic": f"the value model and its train.engine={cfg.train.engine} engine on {cfg.engine.device}",
            "reward": "its tokenizer, the train rows and the reward functions", "reward_model": "the reward models",
            "pairs": "the preference pairs", "rollout_queue": "its queue"}
    return {worker_label(r.name, k): what[r.name] for r in plan.roles.values() for k in range(r.count)}


def _spawn(cfg: Config, role: Role, k: int, prefix: str, args: tuple[Any, ...]) -> Any:
    """Worker ``k`` of ``role`` as the named Ray actor ``<prefix>-<label>`` with the plan's CPUs and devices."""
    import ray

    options = {"name": f"{prefix}-{worker_label(role.name, k)}", "num_cpus": role.cpus, "max_concurrency": 1,
               **device_resources(cfg.engine.device, role.devices)}
    return ray.remote(WORKER_CLASSES[role.name]).options(**options).remote(*args)


def _start_roles(cfg: Config, plan: RunPlan, model_dir: str, dock: TransferDock, prefix: str,
                 excluded: Sequence[int]) -> dict[str, list[Any]]:
    """Role name -> the handles of its workers, started in the plan's order; each gets the plan."""
    # where rank 0 of the actor's (the critic's) ranks publishes its process group's address
    group_keys = {name: f"{prefix}-{name}-{uuid.uuid4().hex}" for name in ("actor", "critic")}
    started: dict[str, list[Any]] = {}
    for role in plan.roles.values():
        started[role.name] = []
        for k in range(role.count):
            if role.name == "rollout_queue":
                args: tuple[Any, ...] = (queue_settings(cfg, plan, excluded),)
            elif role.name in group_keys:
                args = (cfg, plan, model_dir, dock, k, group_keys[role.name])  # rank k of the role's process group
            else:
                args = (cfg, plan, model_dir, dock)
            started[role.name].append(_spawn(cfg, role, k, prefix, args))
    return started


def _workers(started: dict[str, list[Any]], prefix: str) -> Workers:
    def one(role: str) -> Any | None:
        return started[role][0] if started.get(role) else None

    return Workers(actors=started["actor"], reward=one("reward"), reference=one("reference"),
                   critics=started.get("critic", []), reward_model=one("reward_model"),
                   pairs=one("pairs"), generators=started.get("generator", []), rollout_queue=one("rollout_queue"),
                   prefix=prefix)


def _wait_ready(cfg: Config, plan: RunPlan, handles: dict[str, Any]) -> None:
    """Wait for every worker's ``ready``: placed within ``ray.init_timeout_s``, then started within
    ``ray.engine_init_timeout_s`` of its placement (``startup.wait_ready``); raise naming the late or failed ones."""
    limits = StartLimits(placement_s=cfg.ray.init_timeout_s, init_s=cfg.ray.engine_init_timeout_s)
    wait_ready(handles, limits, worker_cpus(plan), building(cfg, plan))


def create_workers(cfg: Config, plan: RunPlan, model_dir: str, dock: TransferDock, name: str,
                   excluded: Sequence[int] = ()) -> Workers:
    """Start the workers of the run ``plan`` (``RunPlan.roles``: how many of each, their CPUs and devices; each
    worker gets the plan), from the
    model at ``model_dir`` (a local directory or s3:// URI, which each worker fetches itself), the train prompts
    ``excluded`` by the length policy left out of the rollout queue's look-ahead; fail fast if they cannot be placed. They belong to the calling process (a pipeline run's supervisor actor): they die with it."""
    import ray

    check_cluster_devices(cfg.engine.device, plan.devices(), ray.cluster_resources())  # engine.device: fail here, not in a worker
    check_cluster_cpus(plan)  # a plan the cluster can never hold: refused now, not after ray.init_timeout_s
    workers = _workers(_start_roles(cfg, plan, model_dir, dock, name, excluded), name)
    _wait_ready(cfg, plan, workers.all())
    return workers


def kill_workers(workers: Workers, timeout_s: float = 60.0) -> None:
    """Kill the workers and wait (bounded) until Ray has released their names, so they can be created again."""
    import ray

    names = [f"{workers.prefix}-{role}" for role in workers.all()]
    for h in workers.all().values():
        ray.kill(h)
    deadline = time.monotonic() + timeout_s
    for name in names:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name)
            except ValueError:
                break
            time.sleep(0.1)
        else:
            raise WorkerStartError(f"worker '{name}' was killed but Ray still lists it after {timeout_s:.0f}s")


def held_run_names(cfg: Config, plan: RunPlan, namespace: str) -> list[str]:
    """The names of this run's workers and dock actors that Ray still holds in ``namespace``."""
    import ray

    workers = {f"{cfg.run.name}-{label}" for label in worker_cpus(plan)}
    dock = f"{run_dock_name(cfg)}/"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == namespace and (a["name"] in workers or a["name"].startswith(dock)))


def wait_run_names_released(cfg: Config, plan: RunPlan, namespace: str, timeout_s: float) -> float:
    """Wait until Ray has released the names of an earlier attempt's workers and dock (they die with their owner,
    a killed or restarted supervisor, but asynchronously: a name still held fails the next create). Returns the
    seconds waited."""
    start = time.monotonic()
    while held := held_run_names(cfg, plan, namespace):
        waited = time.monotonic() - start
        if waited > timeout_s:
            raise WorkerStartError(
                f"run {cfg.run.name!r}: Ray still holds the names {held[:4]} of an earlier attempt's actors in namespace "
                f"{namespace!r} after {timeout_s:.0f}s (waited for them to die with their owner); kill them "
                f"(dockflow pipeline teardown {cfg.run.name}) and resubmit the run"
            )
        time.sleep(0.2)
    return time.monotonic() - start
