"""Held-out scores of a policy that calls tools: the same tool loop as RL rollouts, greedy, a batch at a time.

    spec = tool_spec(cfg.tools, tokenizer)
    tool_scores(model, tokenizer, task.test[:500], inputs, spec)
    # {"accuracy": 0.41, "tool_calls": 1.02, "tool_errors": 0.03}        (+ pass@k / avg@k with eval.pass_k > 1)

Each example's prompt becomes the messages the loop renders with the tools' schemas (``PromptFormat.messages``);
its trajectory runs through ``dockflow.agents.run_rollouts`` with an engine sampler (``BatchSampler``: every
trajectory of a batch advances a turn at a time), within the same limits as in RL (``tools.*`` and the response
width ``rollout.max_new_tokens``). The task's verifier scores the last assistant turn's text
(``Trajectory.answer``). ``tool_calls`` and ``tool_errors`` are per trajectory (greedy ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dockflow.agents import Rollout, ToolSpec, run_rollouts
from dockflow.data import Example, PromptFormat
from dockflow.engines import HFGenerationEngine, SamplingParams
from dockflow.engines.turn_sampler import turn_sampler
from dockflow.eval.greedy import rng_guard
from dockflow.eval.pass_at_k import sample_scores
from dockflow.rewards.verifier import Verifier


def tool_rows(examples: Sequence[Example], fmt: PromptFormat) -> list[dict[str, Any]]:
    """The rows the tool loop takes: ``prompt`` as messages, the answer and the other columns (an environment's
    ``reset`` gets them)."""
    return [{**ex.fields, "answer": ex.answer, "prompt": fmt.messages(ex.prompt)} for ex in examples]


def tool_trajectories(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict[str, Any]],
    spec: ToolSpec,
    params: SamplingParams,
    batch_size: int,
    seed: int = 0,
) -> list[Rollout]:
    """``params.n`` rollouts per row (contiguous per row), ``batch_size`` rows at a time, deterministic given
    ``seed``; the caller's RNG is left as it was."""
    device = next(model.parameters()).device
    engine = HFGenerationEngine(model, tokenizer, device=device, batch_size=batch_size * params.n)
    out: list[Rollout] = []
    with rng_guard(device):
        for start in range(0, len(rows), batch_size):
            chunk = [row for row in rows[start : start + batch_size] for _ in range(params.n)]
            sampler = turn_sampler(engine, tokenizer, params, seed + start)
            out += run_rollouts(
                chunk, sampler, tokenizer, spec.tools, spec.factories, spec.limits, chat_template=spec.chat_template
            )
    return out


def tool_scores(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    spec: ToolSpec,
    *,
    fmt: PromptFormat,
    verifier: Verifier,
    max_new_tokens: int,
    batch_size: int,
    sampled: tuple[int, float, float, int] | None = None,
) -> dict[str, float]:
    """``{"accuracy", "tool_calls", "tool_errors"}`` of greedy tool-using trajectories; with ``sampled`` =
    ``(k, temperature, top_p, seed)`` also ``{"pass@<k>", "avg@<k>"}`` from k sampled trajectories per example."""
    if not examples:
        return {"accuracy": 0.0, "tool_calls": 0.0, "tool_errors": 0.0}
    rows = tool_rows(examples, fmt)
    greedy = tool_trajectories(
        model, tokenizer, rows, spec, SamplingParams(max_new_tokens, greedy=True), batch_size
    )
    n = len(examples)
    scores = {
        "accuracy": sum(verifier(r.trajectory.answer, ex) for r, ex in zip(greedy, examples, strict=True)) / n,
        "tool_calls": sum(r.trajectory.metrics.tool_calls for r in greedy) / n,
        "tool_errors": sum(r.trajectory.metrics.tool_errors for r in greedy) / n,
    }
    if sampled is not None:
        k, temperature, top_p, seed = sampled
        params = SamplingParams(max_new_tokens, temperature, top_p, n=k)
        outs = tool_trajectories(model, tokenizer, rows, spec, params, max(1, batch_size // k), seed)
        correct = [[verifier(r.trajectory.answer, ex) for r in outs[i * k : (i + 1) * k]] for i, ex in enumerate(examples)]
        scores |= sample_scores(correct, k)
    return scores
