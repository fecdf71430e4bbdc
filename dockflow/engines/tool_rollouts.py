"""Multi-turn tool rollouts in the rollout layout of ``dockflow.engines.base``, over any engine's ``sample``.

    out, rollouts = tool_rollouts(engine, tokenizer, rows, spec, params, seed=s, prompt_width=w)   # one trajectory per row x params.n

Each trajectory (``dockflow.agents.run_rollout``) is split at its prompt: the prompt ids are left-padded to
``prompt_width``, everything after it (model turns and tool turns) is the response, right-padded to
``params.max_new_tokens``. ``attention_mask`` is 1 on every real token (the model attends to the tool turns),
``response_mask`` is the trajectory's mask: 1 on model tokens, 0 on tool tokens, so every algorithm's loss,
KL and log-prob means (which all reduce over ``response_mask``) train on model tokens only.
``rollout_log_prob`` is the sampler's log-prob of each model token, 0 elsewhere. A trajectory's tokens are
bounded by ``tools.max_total_tokens``, and its model tokens end within ``rollout.max_new_tokens`` of the prompt
(tool tokens past that width are cut: they are context for nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict

from dockflow.agents import Rollout, run_rollout
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


class _Sampler:
    """``generate(ids, max_new)`` for the loop: one sampled turn up to EOS, its log-probs kept for the dock."""

    def __init__(self, engine: GenerationEngine, eos_id: int, params: SamplingParams, seed: int) -> None:
        self.engine, self.eos, self.params, self.seed, self.calls = engine, eos_id, params, seed, 0
        self.logps: list[float] = []
        self.end: int | None = None  # prompt + rollout.max_new_tokens: no model token past it

    def __call__(self, ids: list[int], max_new: int) -> list[int]:
        if self.end is None:
            self.end = len(ids) + self.params.max_new_tokens
        max_new = min(max_new, self.end - len(ids))
        if max_new <= 0:  # the response width is spent (only tool tokens past it, which are cut)
            return []
        row = torch.tensor([ids], dtype=torch.long)
        tokens, logp = self.engine.sample(
            row, torch.ones_like(row), max_new, self.params, self.seed + self.calls
        )
        self.calls += 1
        new = tokens[0].tolist()
        if self.eos in new:
            new = new[: new.index(self.eos) + 1]
        self.logps += logp[0, : len(new)].tolist()
        return new


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
    (metrics, ``get_reward()``); trajectory k of the batch samples with seeds from ``seed + 1000 * k`` on."""
    tok = tokenizer
    width_r = params.max_new_tokens
    n = len(rows) * params.n
    pad = tok.pad_token_id
    input_ids = torch.full((n, prompt_width + width_r), pad, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    response_mask = torch.zeros((n, width_r), dtype=torch.long)
    rollout_logp = torch.zeros((n, width_r), dtype=torch.float32)
    prompt_length = torch.zeros(n, dtype=torch.long)
    rollouts: list[Rollout] = []
    for k in range(n):
        row = rows[k // params.n]
        sampler = _Sampler(engine, tok.eos_token_id, params, seed + 1000 * k)
        out = run_rollout(
            row, sampler, tok, spec.tools, spec.factories, spec.limits, chat_template=spec.chat_template
        )
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
        rollout_logp[k, model_positions] = torch.tensor(sampler.logps, dtype=torch.float32)
        prompt_length[k] = p
        rollouts.append(out)
    batch = TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": attention,
            "responses": input_ids[:, prompt_width:].clone(),
            "response_mask": response_mask,
            "prompt_length": prompt_length,
            "response_length": attention[:, prompt_width:].sum(-1),  # model and tool tokens
            "rollout_log_prob": rollout_logp,
        },
        batch_size=[n],
    )
    return batch, rollouts


def trajectory_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Per-trajectory means for MLflow: turns, tool calls, tool errors, timeouts, tool-token share, and each
    environment's ``get_reward()`` under its class name."""
    count = max(len(rollouts), 1)
    ms = [r.trajectory.metrics for r in rollouts]
    out = {
        "tools/turns": sum(m.turns for m in ms) / count,
        "tools/tool_calls": sum(m.tool_calls for m in ms) / count,
        "tools/tool_errors": sum(m.tool_errors for m in ms) / count,
        "tools/timeouts": sum(m.timeouts for m in ms) / count,
        "tools/tool_token_share": sum(m.tool_token_share for m in ms) / count,
    }
    rewards: dict[str, list[float]] = {}
    for r in rollouts:
        if r.reward is not None and r.environment is not None:
            rewards.setdefault(r.environment, []).append(float(r.reward))
    out.update({f"tools/reward_{name}": sum(v) / len(v) for name, v in rewards.items()})
    return out
