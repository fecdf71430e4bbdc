"""Held-out scores of a policy as one dict: greedy accuracy, plus pass@k and avg@k when ``eval.pass_k > 1``.

``evaluate_policy`` is what the trainer logs at its evaluation steps; its keys are MLflow metric names.
MLflow allows no '@' in a metric name, so ``pass@8`` is logged as ``pass_at_8``::

    inputs = EvalInputs(cfg.eval, cfg.data, cfg.rollout.max_new_tokens, cfg.run.seed)
    evaluate_policy(model, tok, task.test[:500], inputs)
    # {"eval/test_accuracy": 0.41, "eval/test_pass_at_8": 0.77, "eval/test_avg_at_8": 0.38}

With ``tools:`` (``EvalInputs(..., tools=cfg.tools)``) the policy is scored with its tools, through the same loop
as its rollouts, and the scores add ``eval/<split>_tool_calls`` and ``eval/<split>_tool_errors`` per trajectory.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dockflow.config.data import DataConfig
from dockflow.config.sections import EvalConfig
from dockflow.config.tools import ToolsConfig
from dockflow.data import Example, PromptFormat
from dockflow.eval.greedy import greedy_accuracy
from dockflow.eval.sampling import sampled_scores
from dockflow.rewards.verifier import task_verifier


@dataclass(frozen=True)
class EvalInputs:
    """What scoring a policy reads of a run's config: the ``eval`` and ``data`` sections, the response length
    (``rollout.max_new_tokens``), the seed of the pass@k samples (``run.seed``) and the ``tools`` section (with
    tools, the policy is scored through the tool loop: ``dockflow.eval.tool_scores``)."""

    eval: EvalConfig
    data: DataConfig
    max_new_tokens: int
    seed: int
    tools: ToolsConfig = field(default_factory=ToolsConfig)


def score_examples(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example], inputs: EvalInputs
) -> dict[str, float]:
    """``{"accuracy"}`` (greedy), plus ``{"pass@<k>", "avg@<k>"}`` when ``eval.pass_k > 1``; with tools also
    ``{"tool_calls", "tool_errors"}`` per greedy trajectory (``dockflow.eval.tool_scores``).

    Uses ``eval.batch_size``, ``max_new_tokens``, the prompt format of ``data``, ``eval.temperature``,
    ``eval.top_p`` and ``seed`` (the samples are the same at every evaluation of the same weights); the
    task's own verifier scores them (``dockflow.rewards.verifier``), whatever ``reward.functions`` are.
    """
    ev = inputs.eval
    max_new, fmt, verifier = inputs.max_new_tokens, PromptFormat.of(inputs.data), task_verifier(inputs.data)
    if inputs.tools.enabled:
        from dockflow.agents import tool_spec
        from dockflow.eval.tool_scores import tool_scores

        sampled = (ev.pass_k, ev.temperature, ev.top_p, inputs.seed) if ev.pass_k > 1 else None
        return tool_scores(
            model, tokenizer, examples, tool_spec(inputs.tools, tokenizer), fmt=fmt, verifier=verifier,
            max_new_tokens=max_new, batch_size=ev.batch_size, sampled=sampled,
        )
    scores = {"accuracy": greedy_accuracy(model, tokenizer, examples, ev.batch_size, max_new, fmt, verifier)}
    if ev.pass_k > 1:
        k, seed = ev.pass_k, inputs.seed
        scores |= sampled_scores(
            model, tokenizer, examples, k=k, temperature=ev.temperature, top_p=ev.top_p, max_new_tokens=max_new,
            fmt=fmt, batch_size=ev.batch_size, seed=seed, verifier=verifier,
        )
    return scores


def metric_key(name: str, score: str) -> str:
    """MLflow name of one score of eval set ``name``: ``("test", "pass@8") -> "eval/test_pass_at_8"``."""
    safe = re.sub(r"[^\w.\-]+", "_", name).strip("_") or "data"
    return f"eval/{safe}_{score.replace('@', '_at_')}"


def evaluate_policy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    inputs: EvalInputs,
    split: str = "test",
) -> dict[str, float]:
    """``{"eval/<split>_accuracy", "eval/<split>_pass_at_<k>", "eval/<split>_avg_at_<k>"}`` (the last two when
    ``eval.pass_k > 1``), ready for ``Tracker.log_metrics``."""
    return {metric_key(split, k): v for k, v in score_examples(model, tokenizer, examples, inputs).items()}
