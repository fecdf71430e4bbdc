"""Partial rollout with tools (``dockflow.agents.parking``): a trajectory stopped by a token budget, mid-turn or
between turns, is parked with its turn, its ids and mask, its tool-call counts and its environment (pickled out of
its child), and resumed (after a pickle round trip, as through the rollout queue or a checkpoint) in that turn: the
finished trajectory is the one the loop builds without a budget."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from dockflow.agents import ToolError, run_rollouts
from dockflow.agents.parking import ParkedTrajectory
from dockflow.config.tools import ToolsConfig
from tests.unit.agents.chat import call, prefix_batch
from tests.unit.agents.tools_for_tests import Counter, add

LIMITS = ToolsConfig(max_turns=4, max_total_tokens=4096, timeout_s=5.0)
# Row k's turns: Counter rows call increment twice (2, then 3) and answer; the add rows call add once and answer.
SCRIPTS = {
    "Row 0": [call("increment", '{"by": 2}'), call("increment", '{"by": 3}'), "The counter is at 5."],
    "Row 1": [call("increment", '{"by": 1}'), "Done."],
    "Add": [call("add", '{"a": 3, "b": 4}'), "It is 7."],
}


def prefix_model(tokenizer):
    return prefix_batch(tokenizer, SCRIPTS)


def rows(*names: str) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": name}], "target": 5, "answer": "5"} for name in names]


def until_done(tokenizer, items, tools, factory, budget: int) -> tuple[list, dict[int, list[tuple[int, int]]]]:
    """Run ``items`` under ``budget`` until every rollout finished, parking the others through a pickle round trip;
    the finished rollouts in order, and per rollout the (turn it resumes in, ids of that turn so far) of each park."""
    generate = prefix_model(tokenizer)
    outs = run_rollouts(items, generate, tokenizer, tools, factory, LIMITS, budget=budget)
    done, parks = {}, {k: [] for k in range(len(items))}
    position = list(range(len(items)))
    for _ in range(200):  # a rollout that never gets further would loop for ever
        parked = [(k, o) for k, o in zip(position, outs, strict=True) if isinstance(o, ParkedTrajectory)]
        done.update({k: o for k, o in zip(position, outs, strict=True) if not isinstance(o, ParkedTrajectory)})
        if not parked:
            return [done[k] for k in sorted(done)], parks
        for k, p in parked:
            parks[k].append((p.resumes_in, len(p.turn)))
        position = [k for k, _ in parked]
        again = pickle.loads(pickle.dumps([p for _, p in parked]))  # the queue actor, a checkpoint
        outs = run_rollouts(again, generate, tokenizer, tools, factory, LIMITS, budget=budget)
    raise AssertionError(f"parked rollouts did not finish under budget {budget}: {parks}")


def turn_lengths(tokenizer, name: str) -> list[int]:
    return [len(tokenizer.encode(t, add_special_tokens=False)) + 1 for t in SCRIPTS[name]]


def expected_parks(lengths: list[int], budget: int) -> list[tuple[int, int]]:
    """Where a rollout of turns of ``lengths`` model tokens parks under ``budget``: after every ``budget`` tokens,
    (the turn the next token belongs to, its tokens of that turn so far); at a turn's end, (the next turn, 0)."""
    out = []
    for used in range(budget, sum(lengths), budget):
        turn, before = 0, 0
        while before + lengths[turn] <= used:
            before += lengths[turn]
            turn += 1
        out.append((turn + 1, used - before))
    return out


def same(a, b) -> None:
    ta, tb = a.trajectory, b.trajectory
    assert (ta.token_ids, ta.mask, ta.messages, ta.finish, ta.metrics) == (tb.token_ids, tb.mask, tb.messages,
                                                                         tb.finish, tb.metrics)


def test_an_environment_rollout_parked_anywhere_resumes_in_its_turn_with_its_state(tokenizer) -> None:
    whole = run_rollouts(rows("Row 0", "Row 1"), prefix_model(tokenizer), tokenizer, [], Counter, LIMITS)
    assert [(o.state.count, o.reward, o.trajectory.metrics.turns) for o in whole] == [(5, 1.0, 3), (1, 0.0, 2)]
    lengths = turn_lengths(tokenizer, "Row 0")
    # budgets that end mid-turn 1; exactly at turn 1's end (parked between turns, after its call ran); mid-turn 2
    for budget in (lengths[0] // 2, lengths[0], lengths[0] + lengths[1] // 2):
        outs, seen = until_done(tokenizer, rows("Row 0", "Row 1"), [], Counter, budget)
        assert seen[0] == expected_parks(lengths, budget), (budget, seen)
        for a, b in zip(outs, whole, strict=True):
            same(a, b)
            assert (a.state.count, a.state.target, a.reward, a.environment) == (
                b.state.count, b.state.target, b.reward, b.environment)


def test_the_parked_environment_is_the_one_its_calls_left(tokenizer) -> None:
    first = turn_lengths(tokenizer, "Row 0")[0]
    [parked] = run_rollouts(rows("Row 0"), prefix_model(tokenizer), tokenizer, [], Counter, LIMITS, budget=first)
    assert isinstance(parked, ParkedTrajectory) and parked.turn == [] and parked.resumes_in == 2
    assert parked.trajectory.metrics.tool_calls == 1 and parked.environment == "Counter"
    env = pickle.loads(parked.saved)
    assert (env.count, env.target) == (2, 5)  # reset and the first call ran in the child before it was parked


def test_tool_rollouts_parked_mid_turn_resume_to_the_same_trajectories(tokenizer) -> None:
    whole = run_rollouts(rows("Add", "Add"), prefix_model(tokenizer), tokenizer, [add], None, LIMITS)
    for budget in (7, sum(turn_lengths(tokenizer, "Add")) - 1):
        outs, seen = until_done(tokenizer, rows("Add", "Add"), [add], None, budget)
        assert seen, budget
        for a, b in zip(outs, whole, strict=True):
            same(a, b)
            assert a.state is None and a.reward is None


def test_a_stopped_environment_stays_stopped_after_parking(tokenizer) -> None:
    [parked] = run_rollouts(rows("Row 1"), prefix_model(tokenizer), tokenizer, [], Counter, LIMITS, budget=1)
    parked = replace(parked, lost="the environment was stopped: an earlier call of tool stall timed out")
    [out] = run_rollouts([parked], prefix_model(tokenizer), tokenizer, [], Counter, LIMITS)
    assert out.state is None and out.reward is None
    assert out.trajectory.messages[-2]["content"].startswith("{'error': 'the environment was stopped")


class Unpicklable(Counter):
    def reset(self, **row) -> str:
        self.handle = open(__file__)  # noqa: SIM115 - an open handle: what a real environment might hold
        return super().reset(**row)


def test_an_environment_that_cannot_be_pickled_cannot_be_parked_and_says_so(tokenizer) -> None:
    with pytest.raises(ToolError, match="environment 'Unpicklable' cannot be parked .*__getstate__") as error:
        run_rollouts(rows("Row 0"), prefix_model(tokenizer), tokenizer, [], Unpicklable, LIMITS, budget=3)
    assert "\n" not in str(error.value) and "TextIOWrapper" in str(error.value)  # one line, with pickle's reason
    # without a budget nothing is parked: the same instance only fails where it is copied for environments=
    with pytest.raises(ToolError, match="'Unpicklable' cannot be copied to the reward functions"):
        run_rollouts(rows("Row 0"), prefix_model(tokenizer), tokenizer, [], Unpicklable, LIMITS)
