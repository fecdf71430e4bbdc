"""Create the run's workers as named Ray actors and wait, with a timeout, until they are up."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from dockflow.config import Config
from dockflow.dock import TransferDock
from dockflow.engines.devices import REWARD_MODEL_ROLE, check_cluster_devices, device_resources
from dockflow.workers.actor import ActorWorker
from dockflow.workers.critic import CriticWorker
from dockflow.workers.generator import GeneratorWorker
from dockflow.workers.pairs import PairSource
from dockflow.workers.reference import ReferenceWorker
from dockflow.workers.reward import RewardWorker
from dockflow.workers.reward_model import RewardModelWorker
from dockflow.workers.rollout_queue import RolloutQueue, queue_args


class WorkerStartError(RuntimeError):
    """Workers did not come up in time or died while starting."""


@dataclass
class Workers:
    """Handles of the run's Ray actors; a worker the algorithm does not use is None."""

    actor: Any
    reward: Any | None = None  # algorithms that sample (not offline ones)
    reference: Any | None = None  # offline algorithms (DPO), or a KL penalty
    critic: Any | None = None  # PPO, PF-PPO
    reward_model: Any | None = None  # with reward.models: scores rollouts into rm_scores (workers/reward_model.py)
    pairs: Any | None = None  # offline algorithms: the preference pairs' source
    generators: list[Any] = field(default_factory=list)  # placement.mode=disaggregated
    rollout_queue: Any | None = None  # several generators: the chunks they draw from (workers/rollout_queue.py)
    prefix: str = ""  # the actors are named "<prefix>-<role>"
    actors: list[Any] = field(default_factory=list)  # every actor rank (train.dp); actors[0] is ``actor``

    def __post_init__(self) -> None:
        if not self.actors:
            self.actors = [self.actor]

    def all(self) -> dict[str, Any]:
        named = {"actor": self.actor, "reward": self.reward, "reference": self.reference, "critic": self.critic,
                 "pairs": self.pairs}
        named.update({f"actor-{k}": a for k, a in enumerate(self.actors) if k > 0})
        named.update({f"generator-{k}": g for k, g in enumerate(self.generators)})
        named["rollout-queue"] = self.rollout_queue
        named["reward-model"] = self.reward_model
        return {k: v for k, v in named.items() if v is not None}


def create_workers(cfg: Config, model_dir: str, dock: TransferDock, name: str) -> Workers:
    """Start the workers the algorithm uses, from the model at ``model_dir`` (a local directory or s3:// URI, which
    each worker fetches itself); fail fast if they cannot be placed. They belong to the calling process (a pipeline
    run's supervisor actor): they die with it."""
    import ray

    check_cluster_devices(cfg, ray.cluster_resources())  # engine.device: fail here, not in a worker

    def spawn(cls, label: str, cpus: float, *extra):
        # the role is the label's first word (actor-1 -> actor): engine.device's GPU / NPU for model workers
        options = {"name": f"{name}-{label}", "num_cpus": cpus, "max_concurrency": 1,
                   **device_resources(cfg, label.split("-")[0])}
        return ray.remote(cls).options(**options).remote(cfg, model_dir, dock, *extra)

    dp_key = f"{name}-{uuid.uuid4().hex}"  # where actor rank 0 publishes its process group's address
    actors = [spawn(ActorWorker, "actor" if k == 0 else f"actor-{k}", cfg.ray.actor_cpus, k, dp_key)
              for k in range(cfg.train.dp)]
    recipe = cfg.algorithm.recipe
    workers = Workers(
        actor=actors[0],
        actors=actors,
        reward=spawn(RewardWorker, "reward", 0) if not recipe.offline else None,
        reference=spawn(ReferenceWorker, "reference", cfg.ray.reference_cpus) if recipe.uses_reference(cfg) else None,
        critic=spawn(CriticWorker, "critic", cfg.ray.critic_cpus) if recipe.critic else None,
        pairs=spawn(PairSource, "pairs", 0) if recipe.offline else None,
        generators=[
            spawn(GeneratorWorker, f"generator-{k}", cfg.placement.generator_cpus)
            for k in range(cfg.placement.generators if cfg.placement.mode == "disaggregated" else 0)
        ],
        prefix=name,
    )
    if len(workers.generators) > 1:
        options = {"name": f"{name}-rollout-queue", "num_cpus": 0, "max_concurrency": 1}
        workers.rollout_queue = ray.remote(RolloutQueue).options(**options).remote(*queue_args(cfg))
    if cfg.reward.models and not recipe.offline:
        options = {"name": f"{name}-{REWARD_MODEL_ROLE}", "num_cpus": cfg.reward.model_cpus, "max_concurrency": 1,
                   **device_resources(cfg, REWARD_MODEL_ROLE)}
        workers.reward_model = ray.remote(RewardModelWorker).options(**options).remote(cfg, model_dir, dock)
    handles = workers.all()
    refs = {label: h.ready.remote() for label, h in handles.items()}
    ready, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=cfg.ray.init_timeout_s)
    if pending:
        waiting = [label for label, r in refs.items() if r in pending]
        need = {"actor": cfg.ray.actor_cpus, "reference": cfg.ray.reference_cpus, "critic": cfg.ray.critic_cpus, "reward": 0,
                "rollout-queue": 0, "pairs": 0}
        need.update({g: cfg.placement.generator_cpus for g in refs if g.startswith("generator-")})
        need.update({a: cfg.ray.actor_cpus for a in refs if a.startswith("actor-")})
        need[REWARD_MODEL_ROLE] = cfg.reward.model_cpus
        raise WorkerStartError(
            f"workers {waiting} did not start within ray.init_timeout_s={cfg.ray.init_timeout_s}s. They ask for "
            f"{ {w: need[w] for w in waiting} } CPUs; the cluster has {ray.available_resources().get('CPU', 0)} free. "
            "Lower ray.actor_cpus / ray.reference_cpus / ray.critic_cpus / placement.generator_cpus / reward.model_cpus, "
            "raise ray.num_cpus, or add nodes."
        )
    for label, r in refs.items():
        try:
            ray.get(r)
        except Exception as exc:  # noqa: BLE001 - surface the worker's own error with its name
            raise WorkerStartError(f"the {label} worker failed to start: {exc}") from None
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
