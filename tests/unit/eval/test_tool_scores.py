"""Held-out scores with tools (``dockflow.eval.tool_scores``): the verifier scores each trajectory's final answer turn,
tool calls and errors are per greedy trajectory, pass@k comes from the sampled trajectories."""

from __future__ import annotations

import pytest

from dockflow.agents import Rollout, Trajectory, TrajectoryMetrics
from dockflow.data import Example, PromptFormat
from dockflow.eval import tool_scores as eval_tools
from dockflow.rewards.verifier import verify_answer

EXAMPLES = [Example("What is 1 + 2?", "3"), Example("What is 5 - 9?", "-4")]


def _rollout(answer: str, calls: int, errors: int) -> Rollout:
    turns = [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "calculator", "arguments": {"a": 1, "op": "+", "b": 2}}}]},
             {"role": "tool", "name": "calculator", "content": answer}, {"role": "assistant", "content": answer}]
    traj = Trajectory([], [], 0, [{"role": "user", "content": "q"}, *turns], "stop",
                      TrajectoryMetrics(turns=2, tool_calls=calls, tool_errors=errors), prompt_messages=1)
    return Rollout(traj, None, None)


def test_final_answers_are_scored_and_tool_counts_averaged(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []

    def canned(model, tokenizer, rows, spec, params, batch_size, seed=0):
        asked.append((params.greedy, params.n, [r["prompt"] for r in rows]))
        if params.greedy:  # the first right, the second answers the tool's result wrongly
            return [_rollout("3", 1, 0), _rollout("4", 2, 1)]
        return [_rollout(a, 1, 0) for a in ("3", "0", "1", "-4")]  # 2 samples each

    monkeypatch.setattr(eval_tools, "tool_trajectories", canned)
    scores = eval_tools.tool_scores(None, None, EXAMPLES, None, fmt=PromptFormat(), verifier=verify_answer,
                                    max_new_tokens=32, batch_size=8, sampled=(2, 1.0, 1.0, 0))
    assert scores == {"accuracy": 0.5, "tool_calls": 1.5, "tool_errors": 0.5, "pass@2": 1.0, "avg@2": 0.5}
    assert asked[0] == (True, 1, [[{"role": "user", "content": "What is 1 + 2?"}],
                                  [{"role": "user", "content": "What is 5 - 9?"}]])
    assert asked[1][:2] == (False, 2)
    assert eval_tools.tool_scores(None, None, [], None, fmt=PromptFormat(), verifier=verify_answer,
                                  max_new_tokens=32, batch_size=8) == {"accuracy": 0.0, "tool_calls": 0.0,
                                                                        "tool_errors": 0.0}
