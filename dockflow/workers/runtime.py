"""Per-process set-up of a model worker (torch threads, seeds) and its checkpoint part."""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

from dockflow.config import RayConfig
from dockflow.workers.host_memory import retain_freed_memory

log = logging.getLogger(__name__)


def rank_threads(torch_threads: int, ranks: int = 1) -> int:
    """torch threads of one of ``ranks`` ranks of a model worker: ``ray.torch_threads`` shared by the ranks, as
    they share the worker's CPUs (at least 1 each)."""
    return max(1, torch_threads // max(1, ranks))


def init_worker_process(ray: RayConfig, seed: int, ranks: int = 1) -> None:
    """Fix the torch thread count (Ray sets OMP threads from num_cpus; torch needs it said: ``rank_threads`` for
    one of ``ranks`` ranks), keep freed host memory for reuse (``ray.retain_host_memory``:
    ``dockflow.workers.host_memory``) and seed every RNG."""
    torch.set_num_threads(rank_threads(ray.torch_threads, ranks))
    if ray.retain_host_memory and not retain_freed_memory():
        log.warning("ray.retain_host_memory: this process's C library is not glibc (no mallopt), so it keeps its "
                    "default allocator settings; set ray.retain_host_memory: false to silence this")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Every RNG this process uses, for a checkpoint."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


class ModelWorker:
    """Base of a worker that trains one model: process set-up, and its checkpoint part (engine, i.e. model
    and optimizer, plus RNG states and extras).

    A subclass sets ``part`` (its part name) and ``engine``, and may add to ``extra_state``/``load_extra``.
    """

    part: str
    engine: Any
    rank: int = 0  # of a data-parallel group: every rank computes the state (collective), rank 0 writes it

    def __init__(self, cfg, dock, ranks: int = 1) -> None:
        """``ranks``: how many ranks the worker has (``train.actor_ranks``, ``train.critic_ranks``)."""
        init_worker_process(cfg.ray, cfg.run.seed, ranks)
        self.cfg = cfg
        self.dock = dock

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra(self, state: dict[str, Any]) -> None:
        """Restore what ``extra_state`` saved."""

    def save(self, store, step: int) -> None:
        state = {"engine": self.engine.save_state(store, step, self.part), "rng": rng_state(), **self.extra_state()}
        if self.rank == 0:
            store.write_part(step, self.part, state)

    def load(self, store, step: int) -> None:
        state = store.read_part(step, self.part)
        self.engine.load_state(store, step, self.part, state["engine"])
        set_rng_state(state["rng"])
        self.load_extra(state)
