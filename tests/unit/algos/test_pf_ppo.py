"""PF-PPO policy filtration: which global indices each mode keeps."""

import math

import pytest
import torch

from dockflow.algos.pf_ppo import filter_by_reward

# group 0: rank by reward desc, ties by index: 1 (0.9), 3 (0.9), 0 (0.3), 2 (0.1)
# group 1 (indices 4..7): all equal -> rank 4, 5, 6, 7
REWARDS = torch.tensor([0.3, 0.9, 0.1, 0.9, 0.5, 0.5, 0.5, 0.5])


@pytest.mark.parametrize(
    ("mode", "keep", "expected"),
    [
        ("best", 2, [1, 3, 4, 5]),
        ("worst", 2, [0, 2, 6, 7]),
        ("best_worst", 2, [1, 2, 4, 7]),
        ("best_worst", 3, [1, 2, 3, 4, 5, 7]),  # ceil(3/2) = 2 best, 1 worst
        ("best_worst", 1, [1, 4]),
        ("best", 4, [0, 1, 2, 3, 4, 5, 6, 7]),
        ("worst", 0, []),
    ],
)
def test_deterministic_modes_by_hand(mode, keep, expected):
    out = filter_by_reward(REWARDS, group_size=4, keep=keep, mode=mode)
    assert out.dtype == torch.long
    assert out.tolist() == expected


def test_reward_weighted_keeps_keep_per_group_sorted_and_is_seeded():
    rewards = torch.randn(5 * 6, generator=torch.Generator().manual_seed(1))
    a = filter_by_reward(rewards, 6, 3, "reward_weighted", generator=torch.Generator().manual_seed(7))
    b = filter_by_reward(rewards, 6, 3, "reward_weighted", generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    groups = a.view(5, 3)
    assert torch.equal(groups, groups.sort(dim=1).values)
    assert torch.equal(groups // 6, torch.arange(5).unsqueeze(1).expand(5, 3))
    assert len(set(a.tolist())) == 15


def test_reward_weighted_follows_the_softmax():
    # rewards [0, ln 3] at temperature 1: softmax [0.25, 0.75]; keeping 1 of 2 picks index 1 with p = 0.75
    g = 4000
    rewards = torch.tensor([0.0, math.log(3.0)]).repeat(g)
    out = filter_by_reward(rewards, 2, 1, "reward_weighted", generator=torch.Generator().manual_seed(0))
    assert (out % 2).float().mean().item() == pytest.approx(0.75, abs=0.03)
    # temperature 2: softmax of [0, ln 3 / 2] -> [1, sqrt 3] / (1 + sqrt 3) = 0.634
    hot = filter_by_reward(rewards, 2, 1, "reward_weighted", generator=torch.Generator().manual_seed(0), temperature=2.0)
    assert (hot % 2).float().mean().item() == pytest.approx(math.sqrt(3) / (1 + math.sqrt(3)), abs=0.03)
    # a huge reward gap: probabilities underflow to 0 but all `keep` are still drawn
    extreme = filter_by_reward(torch.tensor([0.0, 1e4, 2e4]), 3, 3, "reward_weighted", temperature=0.01)
    assert extreme.tolist() == [0, 1, 2]


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="keep"):
        filter_by_reward(REWARDS, 4, 5, "best")
    with pytest.raises(ValueError, match="mode"):
        filter_by_reward(REWARDS, 4, 2, "median")
    with pytest.raises(ValueError, match="group_size"):
        filter_by_reward(REWARDS, 3, 1, "best")
    with pytest.raises(ValueError, match="temperature"):
        filter_by_reward(REWARDS, 4, 1, "reward_weighted", temperature=0.0)
