"""The reward worker's advantage state without Ray: which groups of each round get advantages (the plan's group
selector, up to the quota over the iteration's rounds), where they are put, and what a round returns."""

import torch
from tensordict import TensorDict

from dockflow.config import load_config
from dockflow.dock import DockBatch, DockRequest
from dockflow.workers.advantage import AdvantageState, RoundAdvantages
from dockflow.workers.resources import build_plan

N = 2  # group size
# Per dock slot: round 0 at [0, 8), round 1 at [8, 16). Groups of round 0: (1, 0) informative, (1, 1), (0, 0),
# (0, 1) informative; of round 1: (1, 1), (0, 1) informative, (0, 0), (1, 0) informative.
REWARDS = torch.tensor([1.0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 1, 0, 0, 1, 0])


class FakeDock:
    """Hands out the slots from ``next`` on, in request-sized batches; records requests and puts."""

    def __init__(self) -> None:
        self.next, self.requests, self.puts = 0, [], []

    def get(self, request: DockRequest) -> DockBatch:
        self.requests.append(request)
        lo, hi = self.next, self.next + request.batch_size
        self.next = hi
        data = TensorDict({"rewards": REWARDS[lo:hi], "response_mask": torch.ones(hi - lo, 3, dtype=torch.long)},
                          batch_size=[hi - lo])
        return DockBatch(list(range(lo, hi)), data)

    def put(self, indices: list[int], data: TensorDict) -> None:
        self.puts.append((indices, data["advantages"][:, 0].tolist()))


def _config(*extra: str):
    overrides = ["rollout.prompts_per_iter=4", f"rollout.group_size={N}", "train.infer_batch_size=4",
                 "train.mini_batch_size=8", "train.micro_batch_size=8", *extra]
    return load_config("configs/dapo_arith.yaml", overrides)


def test_informative_groups_first_then_the_last_round_fills_the_quota():
    cfg, dock = _config(), FakeDock()
    state = AdvantageState(cfg, build_plan(cfg), dock)

    first = state.compute(iteration=0, round_index=0, last_round=False)
    assert (first.kept, first.filled) == (2, 0)
    assert [p[0] for p in dock.puts] == [[0, 1], [6, 7]]  # the informative groups of each batch of two groups
    assert first.metrics["reward/zero_adv_group_fraction"] == 0.5 and "timing/advantage_s" in first.metrics
    assert dock.requests[0].whole_groups and dock.requests[0].window == build_plan(cfg).dock_window(0)
    assert set(dock.requests[0].columns) >= {"rewards", "response_mask"}

    dock.puts.clear()
    second = state.compute(iteration=0, round_index=1, last_round=True)
    # Two groups were missing: the first batch has one informative group (1), then fills with group 0, taken in
    # slot order; the second batch's groups are past the quota and get none.
    assert (second.kept, second.filled) == (4, 1)
    assert [p[0] for p in dock.puts] == [[8, 9, 10, 11]]
    assert dock.puts[0][1][:2] == [0.0, 0.0] and dock.puts[0][1][2] == -dock.puts[0][1][3] != 0

    dock.next = 0  # the next iteration starts over
    assert state.compute(iteration=1, round_index=0, last_round=False).kept == 2


def test_without_a_selector_every_group_gets_advantages():
    cfg, dock = _config("algorithm.dapo.dynamic_sampling=false"), FakeDock()
    out = AdvantageState(cfg, build_plan(cfg), dock).compute(iteration=0)
    assert out == RoundAdvantages(kept=4, filled=0, metrics=out.metrics)
    assert [p[0] for p in dock.puts] == [[0, 1, 2, 3], [4, 5, 6, 7]]
