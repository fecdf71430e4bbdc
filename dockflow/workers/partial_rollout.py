"""Partial rollout on a generator worker: budgeted generation, parking and resuming through a RolloutQueue.

Each work item is either new prompts (empty rollouts) or parked groups; every unfinished row gets up to
``rollout.partial.token_budget`` new tokens under the weights the generator holds now (a work item marked
without budget runs to the end); finished rows are not decoded again. Groups whose N responses all finished
claim the next slots of the window and are written (those the full window has no slot for wait, ready, in the
queue); the others go back to the queue, parked, with their oldest policy version and one more park. Which
work comes when (over-provisioning included) is the queue's policy: ``dockflow.workers.rollout_queue``.
The parked groups live in memory (the generator's own queue, or the queue actor with several generators): a
restarted run loses them and starts those prompts over.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from tensordict import TensorDict

from dockflow.config import Config
from dockflow.dock import TransferDock
from dockflow.engines import SamplingParams
from dockflow.engines.partial import continue_rollouts, empty_rollouts, unfinished
from dockflow.engines.rollout_layout import left_pad_prompts
from dockflow.workers.rollout import PromptTable, QueueClient, dock_columns, generation_seed, rollout_metrics
from dockflow.workers.rollout_queue import FinishedWork, ParkedGroup, Work

COLUMNS = ("input_ids", "attention_mask", "responses", "response_mask", "prompt_length", "response_length",
           "rollout_log_prob")


def _start(work: Work, cfg: Config, tokenizer: Any, table: PromptTable) -> tuple[TensorDict, list[int], list[int]]:
    """(rollouts, per-group oldest versions (-1: none yet), per-group ages) of a work item."""
    n = cfg.rollout.group_size
    if work.parked:
        data = torch.cat([p.data for p in work.parked])
        return data, [p.version for p in work.parked], [p.age for p in work.parked]
    ids, mask = left_pad_prompts(tokenizer, [table.templated[i] for i in work.prompt_ids], table.width)
    data = empty_rollouts(ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0), cfg.rollout.max_new_tokens,
                          tokenizer.pad_token_id)
    return data, [-1] * len(work.prompt_ids), [0] * len(work.prompt_ids)


def generate_partial_into_dock(
    cfg: Config, engine: Any, tokenizer: Any, dock: TransferDock, table: PromptTable, queue: QueueClient, *,
    iteration: int, policy_version: int, rank: int = 0,
) -> dict[str, float]:
    """Take work for ``iteration`` from ``queue`` until none is left; write finished groups, park the rest."""
    start = time.perf_counter()
    ro, n = cfg.rollout, cfg.rollout.group_size
    params = SamplingParams(ro.max_new_tokens, ro.temperature, ro.top_p, greedy=False, n=1)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    seed = generation_seed(cfg.run.seed, iteration) * 7 + rank * 1_000_003
    counts = dict.fromkeys(
        ("chunks", "new", "parked", "resumed", "overflow", "samples", "prompt_tokens", "response_tokens"), 0
    )
    while (work := queue.take(iteration, rank)) is not None:
        data, versions, ages = _start(work, cfg, tokenizer, table)
        counts["resumed"] += len(work.parked)
        counts["new"] += 0 if work.parked else len(work.prompt_ids)
        data = continue_rollouts(engine, data, params, seed + counts["chunks"], work.budget, pad, eos)
        counts["chunks"] += 1
        open_rows = unfinished(data, eos).view(-1, n).sum(-1)
        prompt_ids = [p.prompt_id for p in work.parked] or work.prompt_ids
        oldest = [policy_version if v < 0 else min(v, policy_version) for v in versions]

        groups = [ParkedGroup(prompt_ids[g], data[g * n : (g + 1) * n].select(*COLUMNS), oldest[g], ages[g], iteration,
                              int(open_rows[g])) for g in range(len(prompt_ids))]
        done = [g for g, p in enumerate(groups) if p.open_rows == 0]
        parked = [p for p in groups if p.open_rows]
        for p in parked:
            p.age += 1
        counts["parked"] += len(parked)
        slot, granted = queue.finish(FinishedWork(iteration, len(groups), len(done), parked,
                                                  budget=work.budget is not None, new=not work.parked))
        if granted < len(done):  # the window is full: the rest wait, finished, for the next one
            queue.park([groups[g] for g in done[granted:]])
            counts["overflow"] += len(done) - granted
            done = done[:granted]
        if done:
            rows = torch.cat([torch.arange(g * n, (g + 1) * n) for g in done])
            out = data[rows]
            first = cfg.dock_window(iteration)[0] + slot * n
            meta = {
                "prompt_id": torch.tensor([prompt_ids[g] for g in done]).repeat_interleave(n),
                "response_length": out["response_length"],
                "policy_version": torch.tensor([oldest[g] for g in done]).repeat_interleave(n),
            }
            dock.put(list(range(first, first + len(rows))), dock_columns(cfg, out), meta)
            counts["samples"] += len(rows)
            counts["prompt_tokens"] += int(out["prompt_length"].sum())
            counts["response_tokens"] += int(out["response_length"].sum())
    metrics = rollout_metrics(counts["prompt_tokens"], counts["response_tokens"], max(counts["samples"], 1), start)
    metrics["rollout/samples"] = float(counts["samples"])
    metrics[f"flow/chunks_generator_{rank}"] = float(counts["chunks"])
    metrics["flow/parked_groups"] = float(counts["parked"])
    metrics["flow/resumed_groups"] = float(counts["resumed"])
    stats = queue.stats(iteration)
    metrics["flow/overflow_groups"] = float(counts["overflow"])
    metrics["flow/new_groups"] = float(counts["new"])
    metrics["flow/parked_groups_waiting_total"] = float(stats["parked"])
    metrics["flow/ready_groups_waiting_total"] = float(stats["ready"])
    metrics["flow/dropped_parked_groups_total"] = float(stats["dropped"])
    metrics["flow/regenerated_parked_groups_total"] = float(stats["regenerated"])
    return metrics
