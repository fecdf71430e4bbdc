"""Tool rollouts in the rollout layout (``dockflow.rollout.multi_turn``): the trajectory mask is the dock's
``response_mask``, so the losses never train on tool tokens."""

from __future__ import annotations

import torch

from dockflow.agents import ToolSpec
from dockflow.agents.records import unpack_record
from dockflow.algos.losses import clipped_policy_loss
from dockflow.algos.ppo import gae_advantages
from dockflow.config.tools import ToolsConfig
from dockflow.engines.interfaces import SamplingParams
from dockflow.rollout.multi_turn import (
    lay_out,
    sample_tool_rollouts,
    tool_rollouts,
    trajectory_metrics,
)
from tests.unit.agents.chat import PrefixEngine, SampleOnlyEngine, call
from tests.unit.agents.tools_for_tests import Counter, add, add_wrong

ROW = {"prompt": [{"role": "user", "content": "What is 3 + 4?"}], "answer": "7"}
W = 1000  # prompt width: the char tokenizer spends ~800 tokens on the tool schema
TURNS = [call("add", '{"a": 3, "b": 4}'), "It is 7."]


class Scripted(SampleOnlyEngine):
    """Answers each ``sample`` (one turn of every trajectory in the batch) with the next scripted turn for every
    row (then EOS, then padding) and log-prob -(position + 1)."""

    def __init__(self, tokenizer, turns: list[str] = TURNS) -> None:
        self.tokenizer, self.turns, self.turn, self.batches = tokenizer, turns, 0, []

    def sample(self, input_ids, attention_mask, max_new_tokens, params, seed, generated=None, row_caps=None):
        ids = self.tokenizer.encode(self.turns[self.turn % len(self.turns)], add_special_tokens=False)
        ids = (ids + [self.tokenizer.eos_token_id])[:max_new_tokens]
        ids += [self.tokenizer.pad_token_id] * (max_new_tokens - len(ids))
        self.turn += 1
        self.batches.append(input_ids.shape[0])
        rows = input_ids.shape[0]
        return torch.tensor([ids] * rows), -torch.arange(1, max_new_tokens + 1, dtype=torch.float32).repeat(rows, 1)



def _rollouts(tokenizer, tool, max_new: int = 200):
    spec = ToolSpec([tool], None, ToolsConfig(max_total_tokens=4096, timeout_s=5.0))
    params = SamplingParams(max_new, 1.0, 1.0, greedy=False, n=2)
    return tool_rollouts(Scripted(tokenizer), tokenizer, [ROW], spec, params, seed=0, prompt_width=W)


def test_the_response_mask_is_the_trajectory_mask_and_attention_covers_tool_tokens(tokenizer) -> None:
    batch, rollouts = _rollouts(tokenizer, add)
    traj = rollouts[0].trajectory
    p, r = traj.prompt_length, len(traj.token_ids) - traj.prompt_length
    assert batch["prompt_length"].tolist() == [p, p] and batch["response_length"].tolist() == [r, r]
    assert batch["response_mask"][0, :r].tolist() == traj.mask[p:]
    assert batch["attention_mask"][0, W - p : W + r].eq(1).all() and batch["attention_mask"].sum() == 2 * (
        p + r
    )
    assert batch["input_ids"][0, W - p : W + r].tolist() == traj.token_ids
    tool_text = tokenizer.decode(batch["responses"][0, :r][batch["response_mask"][0, :r] == 0])
    assert "<tool_response>\n7\n</tool_response>" in tool_text
    # the sampler's log-probs sit on the model tokens, in order; 0 on tool tokens and padding
    model = batch["response_mask"][0].bool()
    turn_lengths = [len(tokenizer.encode(t, add_special_tokens=False)) + 1 for t in TURNS]
    expected = [-float(i) for n in turn_lengths for i in range(1, n + 1)]
    assert batch["rollout_log_prob"][0][model].tolist() == expected
    assert batch["rollout_log_prob"][0][~model].eq(0).all()
    m = trajectory_metrics(rollouts)
    assert (m["tools/turns"], m["tools/tool_calls"], m["tools/tool_errors"]) == (2.0, 1.0, 0.0)
    assert 0.0 < m["tools/tool_token_share"] < 1.0


def test_the_policy_gradient_does_not_depend_on_tool_tokens(tokenizer) -> None:
    """Another tool output (same widths, other tokens) leaves the mask alone; the loss and its gradient are the
    same whatever log-probs the tool tokens get, and that gradient is 0 on every tool token."""
    batch, _ = _rollouts(tokenizer, add)
    other, _ = _rollouts(tokenizer, add_wrong)
    assert torch.equal(batch["response_mask"], other["response_mask"])
    assert not torch.equal(batch["responses"], other["responses"])  # the tool turn's tokens changed
    mask = batch["response_mask"]
    tool = (mask == 0) & batch["attention_mask"][:, W:].bool()
    assert tool.any()
    gen = torch.Generator().manual_seed(0)
    old = batch["rollout_log_prob"]
    grads, losses = [], []
    for scale in (0.0, 5.0):  # tool tokens' log-probs: 0, then arbitrary
        noise = torch.where(tool, scale * torch.randn(mask.shape, generator=gen), torch.zeros(mask.shape))
        logp = (old + 0.1 + noise).requires_grad_()
        out = clipped_policy_loss(logp, old + noise, torch.tensor([1.0, -0.5]), mask, clip_eps=0.2)
        out.loss.backward()
        grads.append(logp.grad)
        losses.append(float(out.loss.detach()))
    assert losses[0] == losses[1] and torch.equal(grads[0], grads[1])
    assert grads[0][tool].eq(0).all() and grads[0][mask.bool()].ne(0).all()
    # PPO's GAE skips the tool tokens: no advantage there, and the value bootstraps from the next model token
    rewards = torch.zeros(mask.shape)
    rewards[:, int(mask[0].nonzero().max())] = torch.tensor([1.0, 0.0])
    adv, ret = gae_advantages(
        rewards, torch.rand(mask.shape, generator=gen), mask, gamma=1.0, lam=1.0, whiten=False
    )
    assert adv[tool].eq(0).all() and ret[tool].eq(0).all() and adv[mask.bool()].ne(0).any()


def test_model_tokens_stay_within_the_response_width(tokenizer) -> None:
    """A width that ends inside the second turn: the turn is cut there, nothing past the width."""
    full, _ = _rollouts(tokenizer, add)
    first_and_tool = (
        int(full["response_length"][0]) - len(tokenizer.encode(TURNS[1], add_special_tokens=False)) - 1
    )
    batch, rollouts = _rollouts(tokenizer, add, max_new=first_and_tool + 3)
    assert (
        int(batch["response_mask"][0].sum())
        == len(tokenizer.encode(TURNS[0], add_special_tokens=False)) + 1 + 3
    )
    assert rollouts[0].trajectory.finish == "max_total_tokens"


def test_the_record_carries_the_conversation_the_environment_and_its_reward(tokenizer) -> None:
    """``reset(**row)`` gets the row (its observation lands in the prompt), the scripted turns call
    ``increment`` and stop; each trajectory's record holds the prompt as the model saw it, the completion in TRL's
    multi-turn form, a copy of its environment instance as the rollout left it and its ``get_reward()``."""
    engine = Scripted(tokenizer, [call("increment", '{"by": 2}'), "Done."])
    spec = ToolSpec([], Counter, ToolsConfig(max_total_tokens=4096, timeout_s=5.0))
    rows = [{**ROW, "target": 2}, {**ROW, "target": 3}]
    params = SamplingParams(200, 1.0, 1.0, greedy=False, n=1)
    batch, rollouts = tool_rollouts(engine, tokenizer, rows, spec, params, seed=0, prompt_width=W)
    assert engine.batches == [2, 2]  # both trajectories sampled together, a turn at a time
    assert [r.reward for r in rollouts] == [1.0, 0.0] and {r.environment for r in rollouts} == {"Counter"}
    assert "target 2" in tokenizer.decode(batch["input_ids"][0, :W][batch["attention_mask"][0, :W].bool()])
    records = [unpack_record(row) for row in batch["tool_record"]]
    assert [(r.reward, r.environment) for r in records] == [(1.0, "Counter"), (0.0, "Counter")]
    assert [(r.state.count, r.state.target) for r in records] == [(2, 2), (2, 3)]
    assert records[1].prompt == [{"role": "user", "content": "What is 3 + 4? (counter at 0, target 3)"}]
    assert records[0].completion == [
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "increment", "arguments": {"by": 2}}}]},
        {"role": "tool", "name": "increment", "content": "2"},
        {"role": "assistant", "content": "Done."},
    ]


def test_partial_tool_rollouts_lay_out_what_uninterrupted_ones_do(tokenizer) -> None:
    """Under a token budget the trajectories come back parked (a ``Sampled`` with their log-probs so far), are passed
    back in until all finished: their rows (ids, masks, the rollout log-probs on the model tokens, the records with
    the environment) equal those of the rollouts run in one go."""
    scripts = {"3 + 4": [call("increment", '{"by": 2}'), call("increment", '{"by": 1}'), "Done."]}
    spec = ToolSpec([], Counter, ToolsConfig(max_total_tokens=4096, timeout_s=5.0))
    rows = [{**ROW, "target": 3}, {**ROW, "target": 4}]
    params = SamplingParams(200, 1.0, 1.0, greedy=False, n=1)
    whole = sample_tool_rollouts(PrefixEngine(tokenizer, scripts), tokenizer, rows, spec, params, seed=0)
    engine = PrefixEngine(tokenizer, scripts)
    items, calls = list(rows), 0
    finished: dict[int, object] = {}
    position = [0, 1]
    while items and calls < 100:  # a trajectory that never gets further would loop for ever
        out = sample_tool_rollouts(engine, tokenizer, items, spec, params, seed=calls, budget=40)
        calls += 1
        finished.update({k: s for k, s in zip(position, out, strict=True) if not s.parked})
        position = [k for k, s in zip(position, out, strict=True) if s.parked]
        items = [s for s in out if s.parked]
    assert not items and calls > 3  # parked mid-turn and between turns (the turns are ~60 tokens)
    assert whole[0].outcome.trajectory.finish == "max_total_tokens"  # the width (200) cuts the answer: resumed alike
    a = lay_out([finished[0], finished[1]], tokenizer, spec, W, 200)
    b = lay_out(whole, tokenizer, spec, W, 200)
    for key in ("input_ids", "attention_mask", "response_mask", "rollout_log_prob", "tool_record"):
        assert torch.equal(a[key], b[key]), key
    assert [unpack_record(r).state.count for r in a["tool_record"]] == [3, 3]
