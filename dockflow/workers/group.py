"""Create the run's workers as named Ray actors and wait, with a timeout, until they are up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dockflow.config import Config
from dockflow.dock import TransferDock
from dockflow.workers.actor import ActorWorker
from dockflow.workers.reference import ReferenceWorker
from dockflow.workers.reward import RewardWorker


class WorkerStartError(RuntimeError):
    """Workers did not come up in time or died while starting."""


@dataclass
class Workers:
    """Handles of the run's Ray actors; ``reference`` is None when the KL penalty is off."""

    actor: Any
    reward: Any
    reference: Any | None = None

    def all(self) -> dict[str, Any]:
        return {k: v for k, v in {"actor": self.actor, "reward": self.reward, "reference": self.reference}.items() if v}


def create_workers(cfg: Config, model_dir: str, dock: TransferDock, name: str) -> Workers:
    """Start actor, reward and (when kl_coef > 0) reference workers; fail fast if they cannot be placed."""
    import ray

    def spawn(cls, label: str, cpus: float):
        return ray.remote(cls).options(name=f"{name}-{label}", num_cpus=cpus, max_concurrency=1).remote(
            cfg, model_dir, dock
        )

    workers = Workers(
        actor=spawn(ActorWorker, "actor", cfg.ray.actor_cpus),
        reward=spawn(RewardWorker, "reward", 0),
        reference=spawn(ReferenceWorker, "reference", cfg.ray.reference_cpus) if cfg.algorithm.kl_coef > 0 else None,
    )
    handles = workers.all()
    refs = {label: h.ready.remote() for label, h in handles.items()}
    ready, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=cfg.ray.init_timeout_s)
    if pending:
        waiting = [label for label, r in refs.items() if r in pending]
        need = {"actor": cfg.ray.actor_cpus, "reference": cfg.ray.reference_cpus, "reward": 0}
        raise WorkerStartError(
            f"workers {waiting} did not start within ray.init_timeout_s={cfg.ray.init_timeout_s}s. They ask for "
            f"{ {w: need[w] for w in waiting} } CPUs; the cluster has {ray.available_resources().get('CPU', 0)} free. "
            "Lower ray.actor_cpus / ray.reference_cpus or add nodes."
        )
    for label, r in refs.items():
        try:
            ray.get(r)
        except Exception as exc:  # noqa: BLE001 - surface the worker's own error with its name
            raise WorkerStartError(f"the {label} worker failed to start: {exc}") from None
    return workers


def kill_workers(workers: Workers) -> None:
    import ray

    for h in workers.all().values():
        ray.kill(h)
