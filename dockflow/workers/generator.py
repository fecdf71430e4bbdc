"""A generator worker (disaggregated placement): its own copy of the policy in a generation engine.

It samples responses into the dock with whatever weights it holds, tagging every sample with their policy
version, and takes new weights when the actor publishes them (the reshard stage). The scheduler decides
when each generation may start, which bounds how stale its samples can get (``dockflow.flow.asynchronous``).
"""

from __future__ import annotations

import time
from typing import Any

from dockflow.config import Config
from dockflow.data import load_task
from dockflow.dock import TransferDock
from dockflow.engines import create_generation_engine
from dockflow.models import load_model_and_tokenizer
from dockflow.workers.partial_rollout import generate_partial_into_dock
from dockflow.workers.rollout import generate_into_dock
from dockflow.workers.rollout_queue import RolloutQueue, rollout_queue
from dockflow.workers.runtime import init_worker_process


class GeneratorWorker:
    """Generate-only policy state: ``generate`` and ``load_weights``, nothing to checkpoint (the actor's
    weights are the policy; a restarted generator gets them republished)."""

    def __init__(self, cfg: Config, model_dir: str, dock: TransferDock) -> None:
        init_worker_process(cfg.ray.torch_threads, cfg.run.seed)
        self.cfg = cfg
        self.dock = dock
        self.model, tokenizer = load_model_and_tokenizer(model_dir, dtype=cfg.model.dtype)
        self.model.eval()
        self.engine = create_generation_engine(cfg, self.model, tokenizer, cpus=cfg.placement.generator_cpus)
        self.tokenizer = tokenizer
        self.queue: RolloutQueue = rollout_queue(cfg)  # used alone (one generator); parked groups live here
        self.train_prompts = load_task(cfg.data, cfg.run.seed).train
        self.policy_version = 0

    def ready(self) -> bool:
        return True

    def generate(
        self, iteration: int, prompt_ids: list[int], first_index: int = 0, queue: Any = None, rank: int = 0,
        opened: Any = None,
    ) -> dict[str, float]:
        """Sample N responses for each prompt into ``iteration``'s dock window from ``first_index`` on, taking
        chunks from ``queue`` (the generators' shared queue actor, ``opened`` for this iteration) or, alone, from
        its own queue; with ``rollout.partial.token_budget`` unfinished groups are parked there."""
        if queue is None:
            queue = self.queue
            queue.open(iteration, prompt_ids)
        if self.cfg.rollout.partial.token_budget is not None:
            out = generate_partial_into_dock(
                self.cfg, self.engine, self.tokenizer, self.dock, self.train_prompts, queue, iteration,
                self.policy_version, rank,
            )
        else:
            out = generate_into_dock(
                self.cfg, self.engine, self.dock, self.train_prompts, iteration, prompt_ids, first_index,
                self.policy_version, queue, rank,
            )
        out["rollout/policy_version"] = float(self.policy_version)
        return out

    def load_weights(self, published: dict[str, Any]) -> dict[str, float]:
        """Take what ``ActorWorker.publish_weights`` returned: bit-exact copies of the policy's tensors."""
        start = time.perf_counter()
        self.engine.load_weights(iter(published["weights"].items()))
        self.policy_version = int(published["version"])
        return {"timing/load_weights_s": time.perf_counter() - start}
