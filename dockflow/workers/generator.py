"""A generator worker (disaggregated placement): its own copy of the policy in a generation engine.

It samples responses into the dock with whatever weights it holds, tagging every sample with their policy
version; each generation names the published policy it must use (the reshard stage publishes one per update),
and the generate stage's gate decides when it may start, which bounds how stale its samples can get
(``dockflow.flow.iteration: waits_for``).
"""

from __future__ import annotations

import time
from typing import Any

from dockflow.algos.plan import SNAPSHOT_CONSUMER, RunPlan
from dockflow.config import Config
from dockflow.data import PromptFormat, load_task
from dockflow.data.length_policy import check_prompt_lengths
from dockflow.dock import DockRequest, TransferDock
from dockflow.engines import EngineInputs, create_generation_engine
from dockflow.engines.routing import check_recording
from dockflow.engines.sync_check import SYNC_CHECK
from dockflow.models import load_model_and_tokenizer
from dockflow.rollout.multi_turn import ToolTable, generate_tools_into_dock
from dockflow.rollout.partial import generate_partial_into_dock
from dockflow.rollout.plain import generate_into_dock
from dockflow.rollout.prompts import PromptTable
from dockflow.rollout.queue import QueueClient, RolloutQueue, checkpoint_types, rollout_queue
from dockflow.storage.objects import fetch_model
from dockflow.workers.runtime import init_worker_process


class GeneratorWorker:
    """Generate-only policy state: ``generate`` (taking newer published weights first), and the checkpoint of
    what is in flight (``save_inflight``). Its weights are the actor's, republished after a restart."""

    def __init__(self, cfg: Config, plan: RunPlan, model_dir: str, dock: TransferDock) -> None:
        self.plan = plan  # the run plan, built once by the driver
        init_worker_process(cfg.ray, cfg.run.seed)
        self.cfg = cfg
        self.dock = dock
        self.model, tokenizer = load_model_and_tokenizer(fetch_model(model_dir, cfg.checkpoint), dtype=cfg.model.dtype)
        self.model.eval()
        # model.lora: vLLM takes the published adapter alone on this plain base model; HF engines the merged weights
        inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed, cfg.model.lora)
        self.engine = create_generation_engine(inputs, self.model, tokenizer, cpus=cfg.placement.generator_cpus)
        check_recording(plan.records_routing, self.engine)
        self.tokenizer = tokenizer
        train = load_task(cfg.data, cfg.run.seed, storage=cfg.checkpoint).train
        self.prompts = PromptTable(PromptFormat.of(cfg.data).render_all([ex.prompt for ex in train], tokenizer),
                                   self.engine)
        context = getattr(self.model.config, "max_position_embeddings", None)
        excluded = check_prompt_lengths(self.prompts.templated, tokenizer, cfg.data, cfg.rollout.max_new_tokens,
                                        context)
        self.queue: RolloutQueue = rollout_queue(cfg, plan, excluded)  # used alone (one generator); parked groups live here
        self.tool_table = ToolTable(cfg, train, tokenizer, context) if cfg.tools.enabled else None
        self.policy_version = 0

    def ready(self) -> bool:
        return True

    def generate(
        self, iteration: int, prompt_ids: list[int], first_index: int = 0, queue: Any = None, rank: int = 0,
        opened: Any = None, weights: dict[str, Any] | None = None,
    ) -> dict[str, float]:
        """Sample N responses for each prompt into ``iteration``'s dock window from ``first_index`` on, taking
        chunks from ``queue`` (the generators' shared queue actor) or, alone, from its own queue. ``opened`` is the
        ref of the queue's ``open`` for this iteration: Ray resolves it before this call runs, so the queue is
        open when the first chunk is taken (its value is not needed); with ``rollout.partial.token_budget``
        unfinished groups are parked there (with tools: their trajectories, mid-turn or between turns, and their
        environments). ``weights``: a policy the actor published (``ActorWorker.publish_weights``), taken first
        when newer than the one held."""
        loaded = self._take(weights)
        if queue is None:
            queue = self.queue
            queue.open(iteration, prompt_ids)
        client = self._client(queue)
        if self.cfg.rollout.partial.token_budget is not None:
            out = generate_partial_into_dock(
                self.cfg, self.engine, self.tokenizer, self.dock, self.prompts, client, iteration=iteration,
                policy_version=self.policy_version, window_start=self.plan.dock_window(iteration)[0], rank=rank,
                tools=self.tool_table,
            )
        elif self.tool_table is not None:
            out = generate_tools_into_dock(
                self.cfg, self.engine, self.dock, self.tool_table, iteration=iteration, prompt_ids=prompt_ids,
                first_index=first_index, policy_version=self.policy_version, queue=client, rank=rank,
                window_start=self.plan.dock_window(iteration)[0],
            )
        else:
            out = generate_into_dock(
                self.cfg, self.engine, self.dock, self.prompts, iteration=iteration, prompt_ids=prompt_ids,
                first_index=first_index, policy_version=self.policy_version, queue=client, rank=rank,
                window_start=self.plan.dock_window(iteration)[0],
            )
        out["rollout/policy_version"] = float(self.policy_version)
        out.update(loaded)
        return out

    def _client(self, queue: Any) -> QueueClient:
        """The generators' shared queue actor (or, None, this worker's own queue), waited on for at most
        ``train.stage_timeout_s`` per call."""
        return QueueClient(self.queue if queue is None else queue, self.cfg.train.stage_timeout_s)

    def _take(self, weights: dict[str, Any] | None) -> dict[str, float]:
        """Load bit-exact copies of the published policy's tensors when they are newer than ours."""
        if weights is None or int(weights["version"]) <= self.policy_version:
            return {}
        start = time.perf_counter()
        self.engine.load_weights(iter(weights["weights"].items()))
        self.policy_version = int(weights["version"])
        out = {"timing/load_weights_s": time.perf_counter() - start}
        if weights.get("probe") is not None:  # WeightSyncError stops the run when the weights did not take
            out[SYNC_CHECK] = self.engine.check_sync(weights["probe"])
        return out

    def save_inflight(self, store: Any, step: int, iterations: list[int], queue: Any = None) -> None:
        """Checkpoint part ``inflight``: the samples of ``iterations`` (generated ahead, not trained on yet), read
        from their dock windows, and the rollout queue's state (parked groups, the prompt stream)."""
        windows = {}
        for j in iterations:
            batch = self.dock.get(DockRequest(SNAPSHOT_CONSUMER, self.cfg.global_batch, window=self.plan.dock_window(j)))
            windows[j] = {"indices": batch.indices, "data": batch.data, "meta": batch.meta}
        state = self._client(queue).state_dict()
        store.write_part(step, "inflight", {"windows": windows, "queue": state})

    def load_inflight(self, store: Any, step: int, queue: Any = None) -> list[int]:
        """Put a checkpoint's in-flight samples back into their windows and restore the queue; returns their
        iterations."""
        part = store.read_part(step, "inflight", types=checkpoint_types())
        for j, w in part["windows"].items():
            self.dock.reset(window=self.plan.dock_window(j))
            self.dock.put(w["indices"], w["data"], w["meta"])
        self._client(queue).load_state_dict(part["queue"])
        return sorted(part["windows"])
