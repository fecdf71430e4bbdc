"""Multi-turn tool rollouts in the rollout layout of ``dockflow.engines.base``, over any engine's ``sample``.

    spec = tool_spec(cfg.tools, tokenizer)                  # the tools imported, the loop's chat template
    out, rollouts = tool_rollouts(engine, tokenizer, rows, spec, params, seed=s, prompt_width=w)   # row x params.n

All trajectories of a call advance a turn at a time (``dockflow.agents.run_rollouts``): one ``sample`` call per
turn for the whole batch (``BatchSampler``). Each trajectory is split at its prompt: the prompt ids are
left-padded to ``prompt_width``, everything after it (model turns and tool turns) is the response,
right-padded to ``params.max_new_tokens``. ``attention_mask`` is 1 on every real token (the model attends to
the tool turns), ``response_mask`` is the trajectory's mask: 1 on model tokens, 0 on tool tokens, so every
algorithm's loss, KL and log-prob means (which all reduce over ``response_mask``) train on model tokens only.
``rollout_log_prob`` is the sampler's log-prob of each model token, 0 elsewhere. A trajectory's tokens are
bounded by ``tools.max_total_tokens``, and its model tokens end within ``rollout.max_new_tokens`` of the prompt
(tool tokens past that width are cut: they are context for nothing). ``tool_record`` holds each trajectory's
conversation and environment for the reward functions (``dockflow.agents.records``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from tensordict import TensorDict

from dockflow.agents import Rollout, import_tool, loop_template, run_rollouts
from dockflow.agents.parking import ParkedTrajectory
from dockflow.agents.records import TrajectoryRecord, pack_record
from dockflow.agents.rollouts import Request
from dockflow.agents.trajectory import TrajectoryMetrics
from dockflow.config.tools import ToolsConfig
from dockflow.engines.base import GenerationEngine, SamplingParams


@dataclass(frozen=True)
class ToolSpec:
    """What the tool loop needs besides the engine: the tools, the environment factories, the limits and the
    chat template it renders with (``loop_template``)."""

    tools: Sequence[Callable[..., Any]]
    factories: Any
    limits: ToolsConfig
    chat_template: str | None = None


def tool_spec(tc: ToolsConfig, tokenizer: Any) -> ToolSpec:
    """The ``tools:`` section's tools and environment factories imported (a ToolError naming a path that does not
    import), and the chat template the loop renders with for ``tokenizer`` (None: the tools only)."""
    factories: Any = None
    if tc.environment:
        factories = import_tool(tc.environment)
    elif tc.environments:
        factories = {name: import_tool(path) for name, path in tc.environments.items()}
    template = loop_template(tokenizer) if tokenizer is not None else None
    return ToolSpec([import_tool(p) for p in tc.functions], factories, tc, template)


class BatchSampler:
    """``generate_batch`` for ``run_rollouts`` over an engine's ``sample``: the turns asked for are left-padded
    into one batch and sampled together (up to the largest budget, each row then cut at its own budget and
    after its EOS); each trajectory's model tokens end within ``params.max_new_tokens`` of its prompt. The
    log-probs of each trajectory's model tokens are kept in order (``logps[k]``)."""

    def __init__(self, engine: GenerationEngine, tokenizer: Any, params: SamplingParams, seed: int) -> None:
        self.engine, self.params, self.seed, self.calls = engine, params, seed, 0
        self.eos, self.pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        self.logps: dict[int, list[float]] = defaultdict(list)
        self.ends: dict[int, int] = {}  # trajectory -> prompt length + max_new_tokens: no model token past it

    def __call__(self, requests: list[Request]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in requests]
        live = []
        for j, (k, ids, budget) in enumerate(requests):
            end = self.ends.setdefault(k, len(ids) + self.params.max_new_tokens)
            cap = min(budget, end - len(ids))
            if cap > 0:  # else the response width is spent (only tool tokens past it, which are cut)
                live.append((j, k, ids, cap))
        if not live:
            return out
        width = max(len(ids) for _, _, ids, _ in live)
        input_ids = torch.full((len(live), width), self.pad, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, (_, _, ids, _) in enumerate(live):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention[row, width - len(ids) :] = 1
        longest = max(cap for *_, cap in live)
        tokens, logp = self.engine.sample(input_ids, attention, longest, self.params, self.seed + self.calls)
        self.calls += 1
        for row, (j, k, _, cap) in enumerate(live):
            new = tokens[row, :cap].tolist()
            if self.eos in new:
                new = new[: new.index(self.eos) + 1]
            out[j] = new
            self.logps[k] += logp[row, : len(new)].tolist()
        return out


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
    sampler = BatchSampler(engine, tokenizer, params, seed)
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
            raise ValueError(
                f"a tool prompt has {p} tokens (tool schemas and the environment's observation "
                f"included), more than the prompt width {prompt_width}: shorten it"
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
