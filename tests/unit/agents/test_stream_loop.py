"""Trajectories each at their own pace (``dockflow.agents.stream_loop``), over a stream whose turns finish a
step after they are asked (vLLM's engine loop, scripted): the same trajectories as the batch driver, a fast
trajectory never waits for a slow one's tool, the budget parks alike, and a hung tool is killed at its timeout
while the others go on."""

from __future__ import annotations

import time

from dockflow.agents import run_rollouts
from dockflow.agents.parking import ParkedTrajectory
from dockflow.agents.stream_loop import TurnStream
from dockflow.config.tools import ToolsConfig
from tests.unit.agents.chat import call, prefix_batch, prefix_turns
from tests.unit.agents.tools_for_tests import add, wait

LIMITS = ToolsConfig(max_turns=4, max_tool_calls=8, max_total_tokens=4096, timeout_s=1.0)
SCRIPTS = {  # the first key in a row's prompt picks its turns
    "slow": [call("wait", '{"seconds": 0.4}'), "Slept."],
    "fast": [call("add", '{"a": 1, "b": 2}'), call("add", '{"a": 3, "b": 4}'), "It is 7."],
    "hang": [call("wait", '{"seconds": 30}'), "Gave up."],
}


class ScriptedStream:
    """A ``TurnStream`` whose model is ``prefix_turns`` (tokens a function of the ids): a turn submitted now
    comes back at the next ``step``; ``log`` is the order the turns finished in, as (trajectory, turn)."""

    def __init__(self, tokenizer) -> None:
        self.next_ids = prefix_turns(tokenizer, SCRIPTS)
        self.running: dict[int, list[int]] = {}
        self.turns: dict[int, int] = {}
        self.log: list[tuple[int, int]] = []

    @property
    def busy(self) -> bool:
        return bool(self.running)

    def submit(self, k: int, ids: list[int], budget: int) -> bool:
        if budget <= 0:
            return False
        self.running[k] = self.next_ids(ids, budget)[0]
        return True

    def step(self) -> list[tuple[int, list[int]]]:
        time.sleep(0.005)  # a decoding step
        done, self.running = list(self.running.items()), {}
        for k, _ in done:
            self.turns[k] = self.turns.get(k, 0) + 1
            self.log.append((k, self.turns[k]))
        return done

    def close(self) -> None:
        self.running.clear()


def _rows(*keys: str) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"Row {k} {key}"}], "answer": "7"} for k, key in enumerate(keys)]


def _run(tokenizer, rows, sampler, budget=None):
    return run_rollouts(rows, sampler, tokenizer, [add, wait], None, LIMITS, budget=budget)


def test_the_stream_gives_the_batch_drivers_trajectories_and_the_fast_one_does_not_wait(tokenizer) -> None:
    rows = _rows("slow", "fast")
    stream = ScriptedStream(tokenizer)
    assert isinstance(stream, TurnStream)
    start = time.perf_counter()
    streamed = _run(tokenizer, rows, stream)
    batched = _run(tokenizer, rows, prefix_batch(tokenizer, SCRIPTS))
    for a, b in zip(streamed, batched, strict=True):
        assert (a.trajectory.token_ids, a.trajectory.mask, a.trajectory.messages) == (
            b.trajectory.token_ids, b.trajectory.mask, b.trajectory.messages)
    assert [r.trajectory.answer for r in streamed] == ["Slept.", "It is 7."]
    # the fast trajectory ran all three turns while the slow one's tool slept (a batch driver would have held
    # its second turn until the 0.4 s call returned)
    assert stream.log.index((1, 3)) < stream.log.index((0, 2))
    assert time.perf_counter() - start < 5.0


def test_a_budget_parks_the_same_turns_as_the_batch_driver(tokenizer) -> None:
    rows = _rows("fast", "slow")
    streamed = _run(tokenizer, rows, ScriptedStream(tokenizer), budget=25)
    batched = _run(tokenizer, rows, prefix_batch(tokenizer, SCRIPTS), budget=25)
    assert all(isinstance(x, ParkedTrajectory) for x in streamed)
    for a, b in zip(streamed, batched, strict=True):
        assert (a.turn, a.trajectory.token_ids, a.trajectory.mask) == (b.turn, b.trajectory.token_ids, b.trajectory.mask)
    resumed = _run(tokenizer, streamed, ScriptedStream(tokenizer))  # parked ones go on to the same end
    assert [r.trajectory.answer for r in resumed] == ["It is 7.", "Slept."]
    whole = _run(tokenizer, rows, ScriptedStream(tokenizer))
    assert [r.trajectory.token_ids for r in resumed] == [r.trajectory.token_ids for r in whole]


def test_a_hung_tool_is_killed_at_its_timeout_and_only_its_trajectory_waits(tokenizer) -> None:
    stream = ScriptedStream(tokenizer)
    start = time.perf_counter()
    hung, fast = _run(tokenizer, _rows("hang", "fast"), stream)
    assert time.perf_counter() - start < 10.0  # the 30 s sleep was cut at tools.timeout_s (1 s)
    assert hung.trajectory.metrics.timeouts == 1 and hung.trajectory.answer == "Gave up."
    assert "timed out after 1 s" in hung.trajectory.messages[-2]["content"]
    assert fast.trajectory.answer == "It is 7." and fast.trajectory.metrics.timeouts == 0
    assert stream.log.index((1, 3)) < stream.log.index((0, 2))
