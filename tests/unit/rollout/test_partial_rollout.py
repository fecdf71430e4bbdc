"""Partial rollout on a generator (``generate_partial_into_dock``) with its queue checkpointed between iterations:
what the resumed generator writes into the dock equals what the uninterrupted one writes, bit for bit, single-turn
(the tiny model, sampled) and multi-turn with the demo's calculator (trajectories parked mid-turn and between turns,
resumed in their turn)."""

from __future__ import annotations

import io
import re

import pytest
import torch

from dockflow.agents.records import unpack_record
from dockflow.config import load_config
from dockflow.data import PromptFormat, load_task
from dockflow.engines import HFGenerationEngine
from dockflow.models import build_char_tokenizer, build_tiny_model
from dockflow.rollout.multi_turn import ToolTable
from dockflow.rollout.partial import generate_partial_into_dock
from dockflow.rollout.prompts import PromptTable, iteration_sampler
from dockflow.rollout.queue import QueueClient, RolloutQueue, checkpoint_types, queue_settings
from dockflow.storage.part_format import read_part_file, write_part_file
from dockflow.workers.resources import build_plan
from tests.unit.agents.chat import PrefixEngine, call, qwen_style

RUN = ["placement.mode=disaggregated", "rollout.prompts_per_iter=3", "rollout.group_size=2", "rollout.batch_size=4",
       "data.arithmetic.num_train=30", "data.arithmetic.num_test=4", "data.arithmetic.num_val=4",
       "data.arithmetic.num_labeled=4", "train.max_staleness=1", "rollout.partial.max_age=2",
       "train.mini_batch_size=6", "train.micro_batch_size=6", "train.infer_batch_size=6"]
TOOLS = ["data.chat_template=true", "tools.max_turns=3", "tools.max_tool_calls=2", "tools.max_total_tokens=1500",
         "rollout.max_new_tokens=400", "rollout.partial.token_budget=100"]
FUNCTION = "tools.functions=[dockflow.agents.calculator:calculator]"
ENVIRONMENT = "tools.environment=tests.unit.agents.tools_for_tests:Tape"  # the calculator, keeping a tape of calls


class Dock:
    """The dock's ``put``, kept: index -> (columns, meta) of that sample; ``versions``: the policy versions of the
    samples put since the caller last emptied it."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[dict, dict]] = {}
        self.versions: list[int] = []

    def put(self, indices, cols, meta) -> None:
        self.versions += meta["policy_version"].tolist()
        for k, index in enumerate(indices):
            self.rows[index] = ({key: cols[key][k].clone() for key in cols.keys()},
                                {key: value[k].clone() for key, value in meta.items()})


def calculator_turns(text: str) -> list[str]:
    """The demo's trajectory for "What is a + b?": a call with op "x" first when a is odd (an error turn), the
    call, the answer."""
    a, op, b = re.search(r"What is (\d+) ([+-]) (\d+)", text).groups()
    right = call("calculator", f'{{"a": {a}, "op": "{op}", "b": {b}}}')
    answer = str(int(a) + int(b) if op == "+" else int(a) - int(b))
    wrong = [call("calculator", f'{{"a": {a}, "op": "x", "b": {b}}}')] if int(a) % 2 else []
    return [*wrong, right, answer]


def run(cfg, engine, tokenizer, table, tools, checkpoint_after: int | None, iterations: int = 4):
    """Generate ``iterations`` iterations into a dock; after ``checkpoint_after`` the queue goes through a
    checkpoint (its data-only part format, as ``save_inflight`` / ``load_inflight``) into a new queue."""
    plan = build_plan(cfg)
    dock, queue, history = Dock(), RolloutQueue(queue_settings(cfg, plan)), []
    sampler = iteration_sampler(cfg, plan)
    for it in range(iterations):
        queue.open(it, sampler.indices(it))
        history.append(generate_partial_into_dock(cfg, engine, tokenizer, dock, table, QueueClient(queue),
                                                  iteration=it, policy_version=it, tools=tools,
                                                  window_start=plan.dock_window(it)[0]))
        history[-1]["lags"] = [it - v for v in dock.versions]  # versions behind the iteration it is written for
        dock.versions = []
        if it == checkpoint_after:
            buffer = io.BytesIO()
            write_part_file(queue.state_dict(), buffer)
            state = read_part_file(io.BytesIO(buffer.getvalue()), "inflight", checkpoint_types())
            queue = RolloutQueue(queue_settings(cfg, plan))
            queue.load_state_dict(state)
    return dock, history, queue


def fields(record) -> tuple:
    """A record's fields, its environment instance as its attributes (an environment need not define ``==``)."""
    state = None if record.state is None else vars(record.state)
    return record.prompt, record.completion, state, record.reward, record.environment


def same(a: Dock, b: Dock) -> None:
    """The same samples at the same indices. ``tool_record`` holds the same record: its pickle's bytes may differ,
    as pickle shares equal objects by identity (a string of a restored trajectory is its own object)."""
    assert a.rows.keys() == b.rows.keys()
    for index, (cols, meta) in a.rows.items():
        other_cols, other_meta = b.rows[index]
        assert cols.keys() == other_cols.keys()
        assert all(torch.equal(cols[k], other_cols[k]) for k in cols if k != "tool_record"), index
        if "tool_record" in cols:
            assert fields(unpack_record(cols["tool_record"])) == fields(unpack_record(other_cols["tool_record"])), index
        assert all(torch.equal(meta[k], other_meta[k]) for k in meta), index


@pytest.mark.parametrize("tool", [FUNCTION, ENVIRONMENT], ids=["function", "environment"])
def test_multi_turn_partial_rollout_resumes_across_a_checkpoint_in_the_right_turn(tool: str) -> None:
    cfg = load_config(None, [*RUN, *TOOLS, tool])
    tokenizer = qwen_style(build_char_tokenizer())
    table = ToolTable(cfg, load_task(cfg.data, cfg.run.seed).train, tokenizer, None)
    engine = PrefixEngine(tokenizer, calculator_turns)
    full, history, queue = run(cfg, engine, tokenizer, None, table, checkpoint_after=None)
    g, n = cfg.rollout.prompts_per_iter, cfg.rollout.group_size
    assert [h["rollout/samples"] for h in history] == [g * n] * 4
    assert sum(h["flow/resumed_groups"] for h in history) > 0 and history[-1]["flow/dropped_parked_groups_total"] == 0
    assert all(1.0 < h["tools/turns"] <= 3.0 and h["tools/tool_calls"] >= 1.0 for h in history)
    resumed, _, _ = run(cfg, PrefixEngine(tokenizer, calculator_turns), tokenizer, None, table, checkpoint_after=1)
    same(full, resumed)
    # what was parked at the checkpoint: trajectories mid-turn and between turns, in later turns too
    _, _, at_checkpoint = run(cfg, PrefixEngine(tokenizer, calculator_turns), tokenizer, None, table,
                              checkpoint_after=None, iterations=2)
    parked = [s.outcome for p in at_checkpoint.parked for s in p.data if getattr(s, "parked", False)]
    where = {(p.resumes_in, bool(p.turn)) for p in parked}
    assert any(t > 1 and mid for t, mid in where), where  # between turns: tests/unit/agents/test_parking.py
    # the staleness bound: a sample's oldest token is at most max_staleness + max_age versions behind its window
    lags = [lag for h in history for lag in h["lags"]]
    assert 0 < max(lags) <= cfg.train.max_staleness + cfg.rollout.partial.max_age and min(lags) >= 0, lags
    for cols, _ in full.rows.values():
        text = tokenizer.decode(cols["responses"][cols["response_mask"].bool()])
        assert "<tool_response>" not in text and "<tool_call>" in text  # the mask is 0 on the tool tokens
        record = unpack_record(cols["tool_record"])
        a, op, b = re.search(r"What is (\d+) ([+-]) (\d+)", record.prompt[-1]["content"]).groups()
        assert record.completion[-1]["content"] == str(int(a) + int(b) if op == "+" else int(a) - int(b))
        if tool == ENVIRONMENT:  # its state went through every park: the refused call of turn 1, the call of turn 2
            assert record.state.tape == [f"{a} x {b}"] * (int(a) % 2) + [f"{a} {op} {b}"] and record.reward == 1.0
        else:
            assert record.state is None and record.reward is None


def test_single_turn_partial_rollout_resumes_across_a_checkpoint() -> None:
    cfg = load_config(None, [*RUN, "rollout.partial.token_budget=3", "rollout.max_new_tokens=8",
                             "rollout.temperature=1.5"])
    tokenizer = build_char_tokenizer()
    engine = HFGenerationEngine(build_tiny_model(cfg.model.tiny, tokenizer, seed=0), tokenizer, device="cpu")
    train = load_task(cfg.data, cfg.run.seed).train
    table = PromptTable(PromptFormat.of(cfg.data).render_all([ex.prompt for ex in train], tokenizer), engine)
    full, history, _ = run(cfg, engine, tokenizer, table, None, checkpoint_after=None)
    assert sum(h["flow/resumed_groups"] for h in history) > 0
    resumed, _, _ = run(cfg, engine, tokenizer, table, None, checkpoint_after=1)
    same(full, resumed)
