"""Unscorable samples (NaN reward: no reward function or model applied to them), as TRL 1.16's GRPOTrainer treats
them: out of every baseline and every normalisation, advantage 0. Checked for each on-line algorithm against the
same estimator run without those samples."""

import math

import pytest
import torch
from tensordict import TensorDict

from dockflow.algos import recipe_of
from dockflow.algos.groups import grpo_advantages, informative_groups
from dockflow.algos.pf_ppo import filter_by_reward
from dockflow.algos.reinforce_pp import reinforce_pp_advantages
from dockflow.algos.rloo import rloo_advantages
from dockflow.config import load_config

NAN = math.nan
# Two groups of 4: the first with one unscorable sample, the second with three.
REWARDS = torch.tensor([1.0, NAN, 0.0, 0.5, NAN, 0.25, NAN, NAN])
SCORED = ~torch.isnan(REWARDS)
MASK = torch.tensor([[1, 1, 1, 0]] * 8)
ONLINE = ["grpo", "dapo", "gspo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "ppo", "pf_ppo"]


def cfg_for(name: str, *extra: str):
    overrides = [f"algorithm.name={name}", "rollout.group_size=4", "rollout.prompts_per_iter=2",
                 "train.mini_batch_size=8", "train.micro_batch_size=4", "algorithm.kl_coef=0.0"]
    if name == "pf_ppo":
        overrides += ["algorithm.pf_ppo.keep=2", "train.mini_batch_size=4"]
    return load_config("configs/grpo_arith.yaml", overrides + list(extra))


@pytest.mark.parametrize("name", ONLINE)
def test_every_algorithm_gives_unscorable_samples_advantage_zero_and_finite_values(name):
    cfg = cfg_for(name)
    data = TensorDict({"rewards": REWARDS, "response_mask": MASK, "values": torch.full((8, 4), 0.3)}, batch_size=[8])
    kept, out = recipe_of(cfg.algorithm.name).advantages(cfg, data, torch.Generator().manual_seed(0))
    adv = out["advantages"]
    assert torch.isfinite(adv).all()
    assert torch.count_nonzero(adv[~SCORED[kept]]) == 0
    assert torch.count_nonzero(adv[SCORED[kept]]) > 0  # the scored ones still learn
    if "returns" in out.keys():  # the critic learns nothing from them either: its own values are the target
        assert torch.equal(out["returns"][~SCORED[kept]], data["values"][kept][~SCORED[kept]] * MASK[kept][~SCORED[kept]])


def test_group_advantages_equal_those_of_the_group_without_its_unscorable_samples():
    adv = grpo_advantages(REWARDS, 4)
    assert adv[[0, 2, 3]].tolist() == pytest.approx(grpo_advantages(torch.tensor([1.0, 0.0, 0.5]), 3).tolist())
    assert adv[5] == 0.0  # a single scored sample has no baseline to differ from
    centred = grpo_advantages(REWARDS, 4, norm_by_std=False)
    assert centred[[0, 2, 3]].tolist() == pytest.approx([0.5, -0.5, 0.0])
    assert torch.equal(grpo_advantages(torch.full((4,), NAN), 4), torch.zeros(4))


def test_leave_one_out_skips_unscorable_samples():
    adv = rloo_advantages(REWARDS, 4)
    assert adv[[0, 2, 3]].tolist() == pytest.approx(rloo_advantages(torch.tensor([1.0, 0.0, 0.5]), 3).tolist())
    assert adv[~SCORED].tolist() == [0.0] * 4 and adv[5] == 0.0


def test_batch_whitening_leaves_unscorable_samples_out():
    adv, _ = reinforce_pp_advantages(REWARDS, MASK)
    alone, _ = reinforce_pp_advantages(REWARDS[SCORED], MASK[SCORED])
    assert torch.allclose(adv[SCORED], alone, atol=1e-6) and torch.count_nonzero(adv[~SCORED]) == 0
    with_baseline, _ = reinforce_pp_advantages(REWARDS, MASK, group_size=4)
    centred = torch.tensor([0.5, -0.5, 0.0, 0.0])  # group means over the scored: 0.5 and 0.25
    expected, _ = reinforce_pp_advantages(centred, MASK[SCORED])
    assert torch.allclose(with_baseline[SCORED], expected, atol=1e-6)


def test_ppo_whitening_and_returns_leave_unscorable_samples_out():
    cfg = cfg_for("ppo")
    values = torch.linspace(0.0, 1.0, 32).view(8, 4)
    _, out = recipe_of(cfg.algorithm.name).advantages(cfg, TensorDict(
        {"rewards": REWARDS, "response_mask": MASK, "values": values}, batch_size=[8]))
    _, alone = recipe_of(cfg.algorithm.name).advantages(cfg, TensorDict(
        {"rewards": REWARDS[SCORED], "response_mask": MASK[SCORED], "values": values[SCORED]}, batch_size=[4]))
    assert torch.allclose(out["advantages"][SCORED], alone["advantages"], atol=1e-6)
    assert torch.allclose(out["returns"][SCORED], alone["returns"], atol=1e-6)


def test_dynamic_sampling_needs_two_different_scored_rewards():
    rewards = torch.tensor([1.0, NAN, 1.0, 1.0, 1.0, NAN, 0.0, NAN, NAN, NAN, NAN, NAN, NAN, NAN, 0.0, NAN])
    assert informative_groups(rewards, 4).tolist() == [False, True, False, False]


@pytest.mark.parametrize("mode", ["best", "worst", "best_worst", "reward_weighted"])
def test_filtration_keeps_unscorable_responses_only_where_too_few_are_scored(mode):
    kept = filter_by_reward(REWARDS, 4, 2, mode, generator=torch.Generator().manual_seed(0), temperature=1.0)
    first, second = kept[:2].tolist(), kept[2:].tolist()
    assert all(SCORED[i] for i in first)  # three scored in the first group: two of them
    assert 5 in second and len(set(second)) == 2  # one scored in the second: it, and one unscorable
    assert filter_by_reward(torch.full((4,), NAN), 4, 3, mode, generator=torch.Generator().manual_seed(0)).numel() == 3
