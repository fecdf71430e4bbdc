"""Multi-turn rollouts with tools (``tools:`` configured): one trajectory per sample, in the rollout layout of
``dockflow.engines.interfaces``, streamed into the dock chunk by chunk as ``generate_into_dock`` does; and
``ToolGroups``, partial rollout's sampler of trajectories parked mid-turn or between turns.

    spec = tool_spec(cfg.tools, tokenizer)                  # the tools imported, the loop's chat template
    out, rollouts = tool_rollouts(engine, tokenizer, rows, spec, params, seed=s, prompt_width=w)   # row x params.n

The trajectories of a call run through ``dockflow.agents.run_rollouts`` over the engine's turn sampler
(``dockflow.engines.turn_sampler.turn_sampler``): on vLLM each at its own pace, every turn a request of its own;
on the HF engine a turn of all of them at a time, one ``sample`` call per round. Each trajectory is split at its prompt:
the prompt ids are left-padded to ``prompt_width``, everything after it (model turns and tool turns) is the
response, right-padded to ``params.max_new_tokens``. ``attention_mask`` is 1 on every real token (the model attends
to the tool turns), ``response_mask`` is the trajectory's mask: 1 on model tokens, 0 on tool tokens, so every
algorithm's loss, KL and log-prob means (which all reduce over ``response_mask``) train on model tokens only.
``rollout_log_prob`` is the sampler's log-prob of each model token, 0 elsewhere. A trajectory's tokens are
bounded by ``tools.max_total_tokens``, and its model tokens end within ``rollout.max_new_tokens`` of the prompt
(tool tokens past that width are cut: they are context for nothing). ``tool_record`` holds each trajectory's
conversation and environment for the reward functions (``dockflow.agents.records``, docs/agents.md).

The dock's prompt column is as wide as the longest train row's prompt rendered with the tool schemas and its
environment's observation (``ToolTable.width``, measured when the worker starts), the response column
``rollout.max_new_tokens``. With partial rollout (``rollout.partial.token_budget``) the generator's
``generate_partial_into_dock`` runs them through ``ToolGroups``: each trajectory gets at most the budget of model
tokens per work item, and one it stops is parked, mid-turn or between turns, with its environment, until a later
work item goes on with it in that turn.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from tensordict import TensorDict

from dockflow.agents import Rollout, ToolSpec, TrajectoryMetrics, run_rollouts, tool_spec
from dockflow.agents.parking import ParkedTrajectory
from dockflow.agents.prompt_width import ToolPromptError, tool_prompt_width
from dockflow.agents.records import TrajectoryRecord, pack_record
from dockflow.config import Config
from dockflow.data import PromptFormat
from dockflow.dock import TransferDock
from dockflow.engines import GenerationEngine, SamplingParams
from dockflow.engines.turn_sampler import turn_sampler
from dockflow.eval.tool_scores import tool_rows
from dockflow.rollout.plain import clipped_rows, dock_columns, generation_seed, rollout_metrics
from dockflow.rollout.queue import QueueClient, QueueSettings, RolloutQueue


def record_of(rollout: Rollout) -> TrajectoryRecord:
    """The rollout as reward functions see it: its prompt and completion messages, its environment."""
    traj = rollout.trajectory
    cut = len(traj.messages) - len(traj.completion)
    return TrajectoryRecord(traj.messages[:cut], traj.completion, rollout.state, rollout.reward, rollout.environment)


class Sampled(NamedTuple):
    """A rollout (``Rollout``: finished; ``ParkedTrajectory``: stopped by partial rollout's budget) and the sampler's
    log-probs of its model tokens so far, in order. A parked one passed back to ``sample_tool_rollouts`` goes on."""

    outcome: Any
    logps: list[float]

    @property
    def parked(self) -> bool:
        return isinstance(self.outcome, ParkedTrajectory)


def sample_tool_rollouts(
    engine: GenerationEngine,
    tokenizer: Any,
    items: Sequence[dict[str, Any] | Sampled],
    spec: ToolSpec,
    params: SamplingParams,
    *,
    seed: int,
    budget: int | None = None,
) -> list[Sampled]:
    """One trajectory per item (a row: ``row["prompt"]`` messages; or a parked ``Sampled`` going on in its turn),
    all a turn at a time; turn ``t`` of the call samples with seed ``seed + t``. ``budget``: model tokens per
    trajectory in this call (partial rollout), past which it comes back parked."""
    sampler = turn_sampler(engine, tokenizer, params, seed)
    rows: list[Any] = []
    for k, item in enumerate(items):
        if isinstance(item, Sampled):
            sampler.ends[k] = item.outcome.trajectory.prompt_length + params.max_new_tokens
            sampler.logps[k] = list(item.logps)
            rows.append(item.outcome)
        else:
            rows.append(item)
    outs = run_rollouts(rows, sampler, tokenizer, spec.tools, spec.factories, spec.limits,
                        chat_template=spec.chat_template, budget=budget)
    return [Sampled(out, sampler.logps[k]) for k, out in enumerate(outs)]


def lay_out(samples: Sequence[Sampled], tokenizer: Any, spec: ToolSpec, prompt_width: int, width_r: int) -> TensorDict:
    """Finished rollouts in the rollout layout (see the module doc), with their ``tool_record``."""
    n = len(samples)
    input_ids = torch.full((n, prompt_width + width_r), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    response_mask = torch.zeros((n, width_r), dtype=torch.long)
    rollout_logp = torch.zeros((n, width_r), dtype=torch.float32)
    prompt_length = torch.zeros(n, dtype=torch.long)
    records = torch.zeros((n, spec.limits.record_bytes), dtype=torch.uint8)
    for k, (out, logps) in enumerate(samples):
        traj = out.trajectory
        p = traj.prompt_length
        if p > prompt_width:
            raise ToolPromptError(
                f"a tool prompt rendered to {p} tokens, more than the {prompt_width} its row rendered to when the run "
                "started (the prompt width): the environment's reset returned a longer observation than then; make "
                "reset's observation for a row the same each time"
            )
        response = traj.token_ids[p:][:width_r]  # past the width: tool tokens only (mask 0), never trained on
        input_ids[k, prompt_width - p : prompt_width + len(response)] = torch.tensor(
            traj.token_ids[: p + width_r]
        )
        attention[k, prompt_width - p : prompt_width + len(response)] = 1
        response_mask[k, : len(response)] = torch.tensor(traj.mask[p:][:width_r])
        model_positions = response_mask[k].nonzero().squeeze(-1)
        rollout_logp[k, model_positions] = torch.tensor(logps, dtype=torch.float32)
        prompt_length[k] = p
        records[k] = torch.from_numpy(pack_record(record_of(out), spec.limits.record_bytes))
    return TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": attention,
            "responses": input_ids[:, prompt_width:].clone(),
            "response_mask": response_mask,
            "prompt_length": prompt_length,
            "response_length": attention[:, prompt_width:].sum(-1),  # model and tool tokens
            "rollout_log_prob": rollout_logp,
            "tool_record": records,
        },
        batch_size=[n],
    )


def tool_rollouts(
    engine: GenerationEngine,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    spec: ToolSpec,
    params: SamplingParams,
    *,
    seed: int,
    prompt_width: int,
) -> tuple[TensorDict, list[Rollout]]:
    """``params.n`` trajectories per row (``row["prompt"]``: messages) in the rollout layout, and the rollouts
    (metrics, ``get_reward()``, the environment's state); turn ``t`` of the batch samples with seed
    ``seed + t``."""
    expanded = [row for row in rows for _ in range(params.n)]
    samples = sample_tool_rollouts(engine, tokenizer, expanded, spec, params, seed=seed)
    batch = lay_out(samples, tokenizer, spec, prompt_width, params.max_new_tokens)
    return batch, [s.outcome for s in samples]


def trajectory_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Per-trajectory means for MLflow: turns, tool calls, tool errors, timeouts, tool-token share."""
    return trajectory_means([r.trajectory.metrics for r in rollouts])


def trajectory_means(ms: Sequence[TrajectoryMetrics]) -> dict[str, float]:
    """``trajectory_metrics`` of the trajectories' metrics."""
    count = max(len(ms), 1)
    return {
        "tools/turns": sum(m.turns for m in ms) / count,
        "tools/tool_calls": sum(m.tool_calls for m in ms) / count,
        "tools/tool_errors": sum(m.tool_errors for m in ms) / count,
        "tools/timeouts": sum(m.timeouts for m in ms) / count,
        "tools/tool_token_share": sum(m.tool_token_share for m in ms) / count,
    }


class ToolTable:
    """The train rows as the tool loop takes them (``prompt``: messages, the answer and the row's other
    columns, for an environment's ``reset``), the tools, the loop's chat template and the prompt width: the
    longest row as the loop renders it (``tool_prompt_width``: schemas and observation included, checked against
    ``tools.max_total_tokens`` and the model's ``context``). One per worker."""

    def __init__(self, cfg: Config, examples: list[Any], tokenizer: Any, context: int | None) -> None:
        self.rows = tool_rows(examples, PromptFormat.of(cfg.data))
        self.spec = tool_spec(cfg.tools, tokenizer)
        self.tokenizer = tokenizer
        self.width = tool_prompt_width(self.rows, tokenizer, self.spec, max_new_tokens=cfg.rollout.max_new_tokens,
                                       context=context)


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
    """Partial rollout's ``GroupSampler`` with tools (``rollout/partial.py``): a group's data is its N
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
