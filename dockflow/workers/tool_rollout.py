"""Generation into the dock with tools (``tools:`` configured): one multi-turn trajectory per sample, through
``dockflow.engines.tool_rollouts``, streamed into the dock chunk by chunk as ``generate_into_dock`` does.

The dock's prompt column is ``tools.max_total_tokens - rollout.max_new_tokens`` wide (a trajectory's prompt
holds the tool schemas and an environment's observation, unknown until ``reset``), the response column
``rollout.max_new_tokens``; ``response_mask`` is the trajectory's mask; ``tool_record`` each trajectory's
conversation and environment for the reward functions (docs/agents.md).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import torch

from dockflow.config import Config
from dockflow.data import PromptFormat
from dockflow.dock import TransferDock
from dockflow.engines import GenerationEngine, SamplingParams
from dockflow.engines.tool_rollouts import tool_rollouts, tool_spec, trajectory_metrics
from dockflow.eval.tools import tool_rows
from dockflow.workers.rollout import QueueClient, dock_columns, generation_seed, rollout_metrics
from dockflow.workers.rollout_queue import QueueSettings, RolloutQueue


class ToolTable:
    """The train rows as the tool loop takes them (``prompt``: messages, the answer and the row's other
    columns, for an environment's ``reset``), the tools and the loop's chat template. One per worker."""

    def __init__(self, cfg: Config, examples: list[Any], tokenizer: Any) -> None:
        self.rows = tool_rows(examples, PromptFormat.of(cfg.data))
        self.spec = tool_spec(cfg.tools, tokenizer)
        self.tokenizer = tokenizer
        self.width = cfg.tools.max_total_tokens - cfg.rollout.max_new_tokens


def generate_tools_into_dock(
    cfg: Config,
    engine: GenerationEngine,
    dock: TransferDock,
    table: ToolTable,
    *,
    iteration: int,
    prompt_ids: list[int],
    first_index: int,
    policy_version: int,
    queue: QueueClient | None = None,
    rank: int = 0,
) -> dict[str, float]:
    """``generate_into_dock`` with the tool loop: N trajectories per prompt into ``iteration``'s window, plus
    the per-trajectory tool metrics (``tools/...``)."""
    start = time.perf_counter()
    ro = cfg.rollout
    if queue is None:
        own = RolloutQueue(QueueSettings(max(1, ro.batch_size // ro.group_size)))
        own.open(iteration, prompt_ids)
        queue = QueueClient(own)
    params = SamplingParams(ro.max_new_tokens, ro.temperature, ro.top_p, greedy=False, n=ro.group_size)
    seed = generation_seed(cfg.run.seed, iteration) + first_index
    totals: dict[str, float] = defaultdict(float)
    rollouts: list[Any] = []
    while (work := queue.take(iteration, rank)) is not None:
        rows = [table.rows[i] for i in work.prompt_ids]
        out, done = tool_rollouts(
            engine,
            table.tokenizer,
            rows,
            table.spec,
            params,
            seed=seed + work.offset * 1_000_000,
            prompt_width=table.width,
        )
        first = cfg.dock_window(iteration)[0] + first_index + work.slot * ro.group_size
        indices = list(range(first, first + out.batch_size[0]))
        meta = {
            "prompt_id": torch.tensor(work.prompt_ids).repeat_interleave(ro.group_size),
            "response_length": out["response_length"],
            "policy_version": torch.full((len(indices),), policy_version),
        }
        cols = dock_columns(cfg, out)
        cols["tool_record"] = out["tool_record"]  # the conversations and environments, for the reward functions
        dock.put(indices, cols, meta)
        totals["prompt"] += int(out["prompt_length"].sum())
        totals["response"] += int(out["response_length"].sum())
        totals["samples"] += len(indices)
        totals["chunks"] += 1
        rollouts += done
    metrics = rollout_metrics(
        int(totals["prompt"]), int(totals["response"]), max(int(totals["samples"]), 1), start
    )
    metrics["rollout/samples"] = totals["samples"]
    metrics[f"flow/chunks_generator_{rank}"] = totals["chunks"]
    metrics.update(trajectory_metrics(rollouts))
    return metrics
