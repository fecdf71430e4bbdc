"""Per-process set-up of a model worker: torch threads and seeds."""

from __future__ import annotations

import random

import numpy as np
import torch


def init_worker_process(threads: int, seed: int) -> None:
    """Fix the torch thread count (Ray sets OMP threads from num_cpus; torch needs it said) and seeds."""
    torch.set_num_threads(max(1, threads))
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
