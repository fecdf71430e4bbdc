"""Generation into the dock with tools (``tools:`` configured): one multi-turn trajectory per sample, through
``dockflow.engines.tool_rollouts``, streamed into the dock chunk by chunk as ``generate_into_dock`` does.

The dock's prompt column is ``tools.max_total_tokens - rollout.max_new_tokens`` wide (a trajectory's prompt
holds the tool schemas and an environment's observation, unknown until ``reset``), the response column
``rollout.max_new_tokens``; ``response_mask`` is the trajectory's mask; ``tool_record`` each trajectory's
conversation and environment for the reward functions (docs/agents.md). With partial rollout
(``rollout.partial.token_budget``) the generator's ``generate_partial_into_dock`` runs them through ``ToolGroups``:
each trajectory gets at most the budget of model tokens per work item, and one it stops is parked, mid-turn or
between turns, with its environment, until a later work item goes on with it in that turn.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict

from dockflow.agents import TrajectoryMetrics
from dockflow.config import Config
from dockflow.data import PromptFormat
from dockflow.dock import TransferDock
from dockflow.engines import GenerationEngine, SamplingParams
from dockflow.engines.tool_rollouts import (
    Sampled,
    lay_out,
    sample_tool_rollouts,
    tool_rollouts,
    tool_spec,
    trajectory_means,
    trajectory_metrics,
)
from dockflow.eval.tools import tool_rows
from dockflow.workers.rollout import QueueClient, clipped_rows, dock_columns, generation_seed, rollout_metrics
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
    window_start: int,
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
        first = window_start + first_index + work.slot * ro.group_size
        indices = list(range(first, first + out.batch_size[0]))
        meta = {
            "prompt_id": torch.tensor(work.prompt_ids).repeat_interleave(ro.group_size),
            "response_length": out["response_length"],
            "policy_version": torch.full((len(indices),), policy_version),
        }
        dock.put(indices, dock_columns(cfg, out), meta)
        totals["prompt"] += int(out["prompt_length"].sum())
        totals["response"] += int(out["response_length"].sum())
        totals["clipped"] += clipped_rows(out)
        totals["samples"] += len(indices)
        totals["chunks"] += 1
        rollouts += done
    metrics = rollout_metrics(
        int(totals["prompt"]), int(totals["response"]), max(int(totals["samples"]), 1), start, int(totals["clipped"])
    )
    metrics["rollout/samples"] = totals["samples"]
    metrics[f"flow/chunks_generator_{rank}"] = totals["chunks"]
    metrics.update(trajectory_metrics(rollouts))
    return metrics


@dataclass
class Finished:
    """A finished trajectory of a partial rollout group: its row of the rollout layout (with ``tool_record``) and
    its metrics, kept until the whole group is done."""

    row: TensorDict  # one row
    metrics: TrajectoryMetrics


class ToolGroups:
    """Partial rollout's ``GroupSampler`` with tools (``workers/partial_rollout.py``): a group's data is its N
    trajectories, each a dataset row (not started), a parked ``Sampled`` (its ``ParkedTrajectory``: the turn, the
    ids, mask and tool-call counts so far, the environment pickled; and its model tokens' log-probs) or
    ``Finished``. Every unfinished trajectory of a work item advances a turn at a time in one batch; work item
    ``chunk``'s turn ``t`` samples with seed ``seed + chunk * 1_000_000 + t``."""

    def __init__(self, cfg: Config, engine: GenerationEngine, table: ToolTable, seed: int) -> None:
        ro = cfg.rollout
        self.cfg, self.engine, self.table, self.seed = cfg, engine, table, seed
        self.params = SamplingParams(ro.max_new_tokens, ro.temperature, ro.top_p, greedy=False, n=1)
        self.written: list[TrajectoryMetrics] = []

    def start(self, prompt_ids: list[int]) -> list[Any]:
        return [[self.table.rows[i]] * self.cfg.rollout.group_size for i in prompt_ids]

    def advance(self, groups: list[Any], budget: int | None, chunk: int) -> list[tuple[Any, int]]:
        out = [list(group) for group in groups]
        where = [(g, j) for g, group in enumerate(groups) for j, x in enumerate(group) if not isinstance(x, Finished)]
        if where:
            table = self.table
            sampled = sample_tool_rollouts(self.engine, table.tokenizer, [groups[g][j] for g, j in where], table.spec,
                                           self.params, seed=self.seed + chunk * 1_000_000, budget=budget)
            finished = [k for k, s in enumerate(sampled) if not s.parked]
            rows = lay_out([sampled[k] for k in finished], table.tokenizer, table.spec, table.width,
                           self.params.max_new_tokens)
            for k, s in enumerate(sampled):
                g, j = where[k]
                out[g][j] = s
            for i, k in enumerate(finished):
                g, j = where[k]
                out[g][j] = Finished(rows[i : i + 1].clone(), sampled[k].outcome.trajectory.metrics)
        return [(group, sum(isinstance(x, Sampled) for x in group)) for group in out]

    def layout(self, groups: list[Any]) -> TensorDict:
        done = [x for group in groups for x in group]
        self.written += [x.metrics for x in done]
        return torch.cat([x.row for x in done])

    def metrics(self) -> dict[str, float]:
        return trajectory_means(self.written) if self.written else {}
