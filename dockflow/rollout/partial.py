"""Partial rollout on a generator worker: budgeted generation, parking and resuming through a RolloutQueue.

Each work item is either new prompts or parked groups; every unfinished rollout gets up to
``rollout.partial.token_budget`` new model tokens under the weights the generator holds now (a work item marked
without budget runs to the end); finished rollouts are not decoded again. Groups whose N rollouts all finished
claim the next slots of the window and are written (those the full window has no slot for wait, ready, in the
queue); the others go back to the queue, parked, with their oldest policy version and one more park. Which
work comes when (over-provisioning included) is the queue's policy: ``dockflow.rollout.queue``.
The parked groups live in memory (the generator's own queue, or the queue actor with several generators), and a
checkpoint holds them (``GeneratorWorker.save_inflight``).

What a group's rollouts are is the sampler's (``GroupSampler``): single-turn, N rows of the rollout layout
continued by ``continue_rollouts`` (``TokenGroups``); with tools, N multi-turn trajectories, each parked mid-turn
or between turns with its environment and resumed in that turn (``rollout/multi_turn.py: ToolGroups``).

``continue_rollouts``: rows of the rollout layout of ``dockflow.engines.interfaces`` (prompt width P, response
width R) whose unfinished rows (no EOS yet, fewer than R tokens) get up to ``budget`` more tokens per call through
the engine's ``sample``. The new tokens and their log-probs (``rollout_log_prob``, under the weights the engine
holds now) are appended after the row's last real token, so the finished row is exactly what one uninterrupted
generation would have laid out.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch
from tensordict import TensorDict

from dockflow.config import Config
from dockflow.dock import TransferDock
from dockflow.engines import GenerationEngine, SamplingParams
from dockflow.engines.token_layout import first_eos_mask, left_pad_prompts, rollout_batch
from dockflow.rollout.multi_turn import ToolGroups
from dockflow.rollout.plain import clipped_rows, dock_columns, generation_seed, rollout_metrics
from dockflow.rollout.prompts import PromptTable
from dockflow.rollout.queue import FinishedWork, ParkedGroup, QueueClient

COLUMNS = ("input_ids", "attention_mask", "responses", "response_mask", "prompt_length", "response_length",
           "rollout_log_prob")


def empty_rollouts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, width_r: int, pad: int) -> TensorDict:
    """Rollouts of left-padded prompts with no response tokens yet."""
    responses = torch.full((prompt_ids.shape[0], width_r), pad, dtype=torch.long)
    out = rollout_batch(prompt_ids, prompt_mask, responses, torch.zeros_like(responses))
    out["rollout_log_prob"] = torch.zeros(responses.shape, dtype=torch.float32)
    return out


def unfinished(data: TensorDict, eos: int) -> torch.Tensor:
    """[B] bool: rows without EOS that still have room for tokens."""
    mask = data["response_mask"].bool()
    has_eos = ((data["responses"] == eos) & mask).any(-1)
    return ~has_eos & (data["response_length"] < data["responses"].shape[1])


def continue_rollouts(
    engine: GenerationEngine, data: TensorDict, params: SamplingParams, seed: int, budget: int | None, pad: int, eos: int
) -> TensorDict:
    """``data`` with each unfinished row continued by up to ``budget`` (None: until EOS or R) sampled tokens."""
    out = data.clone()
    rows = unfinished(data, eos).nonzero().flatten()
    if len(rows) == 0:
        return out
    width_r = data["responses"].shape[1]
    lengths = data["response_length"][rows]
    room = width_r - lengths  # tokens each row may still take
    cap = room.clamp(max=budget) if budget is not None else room
    # Left-pad prompt + response-so-far of each row into one block.
    seqs = [data["input_ids"][r][data["attention_mask"][r].bool()] for r in rows.tolist()]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for k, s in enumerate(seqs):
        ids[k, width - len(s):], mask[k, width - len(s):] = s, 1
    tokens, logp = engine.sample(ids, mask, int(cap.max()), params, seed, generated=lengths, row_caps=cap)
    new_mask = first_eos_mask(tokens, eos) * (torch.arange(tokens.shape[1]) < cap.unsqueeze(1)).long()
    prompt_w = data["input_ids"].shape[1] - width_r
    for k, r in enumerate(rows.tolist()):
        n, at = int(new_mask[k].sum()), int(lengths[k])
        out["responses"][r, at : at + n] = tokens[k, :n]
        out["response_mask"][r, at : at + n] = 1
        out["rollout_log_prob"][r, at : at + n] = logp[k, :n]
        out["input_ids"][r, prompt_w + at : prompt_w + at + n] = tokens[k, :n]
        out["attention_mask"][r, prompt_w + at : prompt_w + at + n] = 1
        out["response_length"][r] = at + n
    return out


class GroupSampler(Protocol):
    """What partial rollout needs of one kind of rollout. A group's ``data`` is whatever the sampler keeps of
    its N rollouts (it travels in a ``ParkedGroup``: picklable, for the queue actor and the checkpoint)."""

    def start(self, prompt_ids: list[int]) -> list[Any]:
        """The data of new groups, nothing generated yet."""

    def advance(self, groups: list[Any], budget: int | None, chunk: int) -> list[tuple[Any, int]]:
        """Each group's data after up to ``budget`` more model tokens per unfinished rollout (None: to the end),
        with how many of its rollouts are still unfinished; ``chunk``: the work item's number (its seed)."""

    def layout(self, groups: list[Any]) -> TensorDict:
        """Finished groups in the rollout layout, with ``rollout_log_prob`` (and what else the dock gets)."""

    def metrics(self) -> dict[str, float]:
        """Metrics of what ``layout`` gave out so far."""


class TokenGroups:
    """Single-turn rollouts: a group's data is its N rows of the rollout layout (a TensorDict)."""

    def __init__(self, cfg: Config, engine: Any, tokenizer: Any, table: PromptTable, seed: int) -> None:
        ro = cfg.rollout
        self.cfg, self.engine, self.tokenizer, self.table, self.seed = cfg, engine, tokenizer, table, seed
        self.params = SamplingParams(ro.max_new_tokens, ro.temperature, ro.top_p, greedy=False, n=1)

    def start(self, prompt_ids: list[int]) -> list[Any]:
        n, tok = self.cfg.rollout.group_size, self.tokenizer
        ids, mask = left_pad_prompts(tok, [self.table.templated[i] for i in prompt_ids], self.table.width)
        data = empty_rollouts(ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0),
                              self.cfg.rollout.max_new_tokens, tok.pad_token_id)
        return [data[g * n : (g + 1) * n] for g in range(len(prompt_ids))]

    def advance(self, groups: list[Any], budget: int | None, chunk: int) -> list[tuple[Any, int]]:
        n, pad, eos = self.cfg.rollout.group_size, self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        data = continue_rollouts(self.engine, torch.cat(groups), self.params, self.seed + chunk, budget, pad, eos)
        open_rows = unfinished(data, eos).view(-1, n).sum(-1)
        return [(data[g * n : (g + 1) * n].select(*COLUMNS), int(open_rows[g])) for g in range(len(groups))]

    def layout(self, groups: list[Any]) -> TensorDict:
        return torch.cat(groups)

    def metrics(self) -> dict[str, float]:
        return {}


def generate_partial_into_dock(
    cfg: Config, engine: Any, tokenizer: Any, dock: TransferDock, table: PromptTable, queue: QueueClient, *,
    iteration: int, policy_version: int, window_start: int, rank: int = 0, tools: Any = None,
) -> dict[str, float]:
    """Take work for ``iteration`` from ``queue`` until none is left; write finished groups, park the rest
    (into ``iteration``'s window, from dock index ``window_start``: the plan's ``dock_window(iteration)[0]``).
    ``tools``: the worker's ``ToolTable`` (multi-turn trajectories with tools; None: single-turn)."""
    start = time.perf_counter()
    n = cfg.rollout.group_size
    seed = generation_seed(cfg.run.seed, iteration) * 7 + rank * 1_000_003
    sampler: GroupSampler = (ToolGroups(cfg, engine, tools, seed) if tools is not None
                             else TokenGroups(cfg, engine, tokenizer, table, seed))
    counts = dict.fromkeys(
        ("chunks", "new", "parked", "resumed", "overflow", "samples", "prompt_tokens", "response_tokens", "clipped"),
        0
    )
    while (work := queue.take(iteration, rank)) is not None:
        if work.parked:
            data = [p.data for p in work.parked]
            versions, ages = [p.version for p in work.parked], [p.age for p in work.parked]
        else:
            data, versions, ages = sampler.start(work.prompt_ids), [-1] * len(work.prompt_ids), [0] * len(work.prompt_ids)
        counts["resumed"] += len(work.parked)
        counts["new"] += 0 if work.parked else len(work.prompt_ids)
        advanced = sampler.advance(data, work.budget, counts["chunks"])
        counts["chunks"] += 1
        prompt_ids = [p.prompt_id for p in work.parked] or work.prompt_ids
        oldest = [policy_version if v < 0 else min(v, policy_version) for v in versions]

        groups = [ParkedGroup(prompt_ids[g], d, oldest[g], ages[g], iteration, open_rows)
                  for g, (d, open_rows) in enumerate(advanced)]
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
            out = sampler.layout([groups[g].data for g in done])
            first = window_start + slot * n
            meta = {
                "prompt_id": torch.tensor([prompt_ids[g] for g in done]).repeat_interleave(n),
                "response_length": out["response_length"],
                "policy_version": torch.tensor([oldest[g] for g in done]).repeat_interleave(n),
            }
            dock.put(list(range(first, first + len(out))), dock_columns(cfg, out), meta)
            counts["samples"] += len(out)
            counts["prompt_tokens"] += int(out["prompt_length"].sum())
            counts["response_tokens"] += int(out["response_length"].sum())
            counts["clipped"] += clipped_rows(out)
    return _metrics(counts, queue.stats(iteration), sampler.metrics(), rank, start)


def _metrics(counts: dict[str, int], stats: dict[str, Any], extra: dict[str, float], rank: int,
             start: float) -> dict[str, float]:
    metrics = rollout_metrics(counts["prompt_tokens"], counts["response_tokens"], max(counts["samples"], 1), start,
                              counts["clipped"])
    metrics["rollout/samples"] = float(counts["samples"])
    metrics[f"flow/chunks_generator_{rank}"] = float(counts["chunks"])
    metrics["flow/parked_groups"] = float(counts["parked"])
    metrics["flow/resumed_groups"] = float(counts["resumed"])
    metrics["flow/overflow_groups"] = float(counts["overflow"])
    metrics["flow/new_groups"] = float(counts["new"])
    metrics["flow/parked_groups_waiting_total"] = float(stats["parked"])
    metrics["flow/ready_groups_waiting_total"] = float(stats["ready"])
    metrics["flow/dropped_parked_groups_total"] = float(stats["dropped"])
    metrics["flow/regenerated_parked_groups_total"] = float(stats["regenerated"])
    metrics.update(extra)
    return metrics
