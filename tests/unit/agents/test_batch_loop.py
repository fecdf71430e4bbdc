"""Many trajectories a turn at a time (``dockflow.agents.batch_loop``): the batch changes how turns are sampled,
never what a trajectory holds; and the engine sampler that serves a batch's turns (``BatchSampler``)."""

from __future__ import annotations

from collections import defaultdict

import torch

from dockflow.agents import run_rollout, run_rollouts
from dockflow.config.tools import ToolsConfig
from dockflow.engines.interfaces import SamplingParams
from dockflow.engines.turn_sampler import BatchSampler
from tests.unit.agents.chat import call
from tests.unit.agents.tools_for_tests import Counter, add

LIMITS = ToolsConfig(max_turns=4, max_total_tokens=4096, timeout_s=5.0)
# Row k's turns: k calls of add, then an answer: the rows finish after 1, 2 and 3 turns.
SCRIPTS = [[call("add", f'{{"a": {k}, "b": {t}}}') for t in range(k)] + [f"Done {k}."] for k in range(3)]


def _rows(n: int) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"Row {k}"}], "answer": str(k), "row": k} for k in range(n)]


def _scripted(tokenizer, scripts: list[list[str]]):
    """A ``generate_batch`` answering trajectory k's t-th turn with ``scripts[k][t]`` (then EOS), and the
    trajectories each call was asked for."""
    done: dict[int, int] = defaultdict(int)
    asked: list[list[int]] = []

    def generate(requests):
        asked.append([k for k, _, _ in requests])
        out = []
        for k, _, _ in requests:
            out.append(tokenizer.encode(scripts[k][done[k]], add_special_tokens=False) + [tokenizer.eos_token_id])
            done[k] += 1
        return out

    return generate, asked


def test_a_batch_holds_the_same_trajectories_as_one_rollout_at_a_time(tokenizer) -> None:
    generate, asked = _scripted(tokenizer, SCRIPTS)
    batch = run_rollouts(_rows(3), generate, tokenizer, [add], None, LIMITS)
    assert asked == [[0, 1, 2], [1, 2], [2]]  # one call per turn; a trajectory that stopped drops out
    for k, out in enumerate(batch):
        one, _ = _scripted(tokenizer, [SCRIPTS[k]])
        alone = run_rollout(_rows(3)[k], lambda ids, n, one=one: one([(0, ids, n)])[0], tokenizer, [add], None, LIMITS)
        assert out.trajectory.token_ids == alone.trajectory.token_ids and out.trajectory.mask == alone.trajectory.mask
        assert out.trajectory.metrics.tool_calls == k and out.trajectory.answer == f"Done {k}."


def test_each_environment_rollout_gets_its_own_instance_and_a_copy_of_it_comes_back(tokenizer) -> None:
    rows = [{**r, "target": 2 + k} for k, r in enumerate(_rows(2))]
    once, twice = call("increment", '{"by": 2}'), call("increment", '{"by": 1}')
    generate, _ = _scripted(tokenizer, [[once, "Done."], [once, twice, "Done."]])
    outs = run_rollouts(rows, generate, tokenizer, [], Counter, LIMITS)
    assert [o.environment for o in outs] == ["Counter", "Counter"]
    assert [(o.state.count, o.state.target, o.reward) for o in outs] == [(2, 2, 1.0), (3, 3, 1.0)]
    assert outs[1].trajectory.completion[3] == {"role": "tool", "name": "increment", "content": "3"}


class FakeEngine:
    """Samples fixed tokens: row r continues with r+10, r+11, ..., EOS at position 2 for odd rows."""

    def __init__(self, eos: int) -> None:
        self.eos, self.calls = eos, []

    def sample(self, input_ids, attention_mask, max_new_tokens, params, seed):
        self.calls.append((input_ids.clone(), attention_mask.clone(), max_new_tokens, seed))
        rows = input_ids.shape[0]
        tokens = torch.arange(max_new_tokens).repeat(rows, 1) + 10 * (torch.arange(rows).unsqueeze(1) + 1)
        if max_new_tokens > 2:
            tokens[1::2, 2] = self.eos
        return tokens, -torch.ones(rows, max_new_tokens)


def test_the_batch_sampler_left_pads_cuts_each_row_and_keeps_its_log_probs() -> None:
    engine = FakeEngine(eos=99)
    tok = type("Tok", (), {"eos_token_id": 99, "pad_token_id": 0})()
    sampler = BatchSampler(engine, tok, SamplingParams(6, greedy=True), seed=7)
    out = sampler([(0, [5, 6, 7], 4), (3, [5], 100), (4, [1, 2], 0)])
    ids, mask, longest, seed = engine.calls[0]
    assert ids.tolist() == [[5, 6, 7], [0, 0, 5]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]  # row 4: no budget
    assert (longest, seed) == (6, 7)  # the largest cap: row 3's response width (6), not its budget
    assert out == [[10, 11, 12, 13], [20, 21, 99], []]  # row 0 cut at its budget, row 3 after its EOS
    assert sampler.logps[0] == [-1.0] * 4 and sampler.logps[3] == [-1.0] * 3
    # the next turn of trajectory 3: its model tokens still end within 6 of its prompt
    assert sampler([(3, [5, 20, 21, 99, 8], 100)]) == [[10, 11]] and engine.calls[1][3] == 8
