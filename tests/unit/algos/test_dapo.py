"""DAPO's soft overlong punishment, dynamic-sampling group filter and group selector, by hand."""

import pytest
import torch

from dockflow.algos.dapo import DynamicSampling, overlong_penalty
from dockflow.algos.groups import informative_groups
from dockflow.algos.plan import GroupSelection
from dockflow.config import load_config
from dockflow.workers.resources import build_plan


def test_overlong_penalty_by_hand():
    # max_length 20, buffer 4: free up to 16, then (16 - L) / 4, -1 at 20 and beyond; times penalty 0.5
    lengths = torch.tensor([10, 16, 17, 18, 20, 21, 100])
    out = overlong_penalty(lengths, max_length=20, buffer_length=4, penalty=0.5)
    expected = 0.5 * torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0])
    assert torch.allclose(out, expected)
    assert out.dtype.is_floating_point


def test_overlong_penalty_without_buffer_is_a_step():
    out = overlong_penalty(torch.tensor([0, 20, 21]), max_length=20, buffer_length=0, penalty=1.0)
    assert torch.allclose(out, torch.tensor([0.0, 0.0, -1.0]))
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_penalty(torch.tensor([1]), max_length=4, buffer_length=5, penalty=1.0)


def test_informative_groups():
    rewards = torch.tensor([1.0, 0, 1, 0, 0, 0, 0.5, 1, 0.5, 1, 1, 1])
    assert torch.equal(informative_groups(rewards, 3), torch.tensor([True, False, True, False]))
    assert torch.equal(informative_groups(torch.tensor([0.0, 1.0]), 1), torch.tensor([False, False]))
    with pytest.raises(ValueError, match="group_size"):
        informative_groups(torch.ones(5), 2)


def test_dynamic_sampling_takes_informative_groups_first_and_fills_only_on_the_last_round():
    selector = DynamicSampling()
    # groups: (1, 0) informative, (1, 1) not, (0, 0) not, (0, 1) informative
    rewards = torch.tensor([1.0, 0, 1, 1, 0, 0, 0, 1])
    assert selector.select(rewards, 2, wanted=4, last_round=False) == GroupSelection(groups=[0, 3], filled=0)
    assert selector.select(rewards, 2, wanted=1, last_round=False) == GroupSelection(groups=[0], filled=0)
    # last round: the informative ones, then the others in order, at most ``wanted``, in ascending position
    assert selector.select(rewards, 2, wanted=3, last_round=True) == GroupSelection(groups=[0, 1, 3], filled=1)
    assert selector.select(rewards, 2, wanted=4, last_round=True) == GroupSelection(groups=[0, 1, 2, 3], filled=2)
    assert selector.select(rewards, 2, wanted=0, last_round=True) == GroupSelection(groups=[], filled=0)
    assert selector.select(rewards, 2, wanted=-1, last_round=True).groups == []


def test_dynamic_sampling_metrics_and_the_recipes_sampling():
    assert DynamicSampling().metrics(kept=30, filled=2, rounds=3) == {
        "dapo/kept_groups": 30.0, "dapo/filled_groups": 2.0, "dapo/rounds": 3.0}
    cfg = load_config("configs/dapo_arith.yaml", ["algorithm.dapo.max_rounds=4"])
    sampling = build_plan(cfg).sampling
    assert (sampling.rounds, sampling.quota, sampling.in_rounds) == (4, cfg.rollout.prompts_per_iter, True)
    assert isinstance(sampling.selector, DynamicSampling)
    assert build_plan(cfg).dock_window(1) == (0, 4 * cfg.global_batch) and build_plan(cfg).dock_capacity == 4 * cfg.global_batch
    off = build_plan(load_config("configs/dapo_arith.yaml", ["algorithm.dapo.dynamic_sampling=false"])).sampling
    assert (off.rounds, off.selector, off.in_rounds) == (1, None, False)
    grpo = load_config("configs/grpo_arith.yaml")
    assert not build_plan(grpo).sampling.in_rounds and build_plan(grpo).dock_capacity == grpo.global_batch
