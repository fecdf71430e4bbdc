"""REINFORCE++ and REINFORCE++-baseline advantages, by hand."""

import math

import pytest
import torch

from dockflow.algos.reinforce_pp import reinforce_pp_advantages


def test_global_whitening_by_hand():
    # rewards [1, 0], gamma 1: returns [[1, 1, 1], [0, 0, pad]]
    # 5 real tokens: mean 0.6, biased var (3*0.16 + 2*0.36)/5 = 0.24 -> std sqrt(0.24)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), mask)
    s = math.sqrt(0.24)
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert torch.allclose(adv, torch.tensor([[0.4 / s] * 3, [-0.6 / s, -0.6 / s, 0.0]]))


def test_kl_shaping_and_discount_by_hand():
    # reward 1, kl [0.1, 0.2, 0.3], kl_coef 0.5 -> token rewards [-0.05, -0.1, 0.85]
    # gamma 0.5: G2 = 0.85, G1 = -0.1 + 0.425 = 0.325, G0 = -0.05 + 0.1625 = 0.1125
    # whitened with the second, all-masked row contributing nothing:
    # mean 0.4291667, var 0.0960764, std 0.3099619 -> [-1.021631, -0.336063, 1.357694]
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [1.0, 1.0, 1.0]])
    adv, ret = reinforce_pp_advantages(torch.tensor([1.0, 5.0]), mask, kl=kl, kl_coef=0.5, gamma=0.5)
    assert torch.allclose(ret, torch.tensor([[0.1125, 0.325, 0.85], [0.0, 0.0, 0.0]]))
    assert torch.allclose(adv, torch.tensor([[-1.021631, -0.336063, 1.357694], [0.0, 0.0, 0.0]]), atol=1e-5)


def test_baseline_subtracts_the_group_mean():
    # groups [1, 0] and [1, 1]: centred [0.5, -0.5, 0, 0]; R = 2 all real, gamma 1
    # returns [[.5,.5],[-.5,-.5],[0,0],[0,0]]: mean 0, var 8*... = (4 * 0.25) / 8 = 0.125
    adv, ret = reinforce_pp_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.ones(4, 2), group_size=2)
    assert torch.allclose(ret, torch.tensor([[0.5, 0.5], [-0.5, -0.5], [0.0, 0.0], [0.0, 0.0]]))
    r = 0.5 / math.sqrt(0.125)
    assert torch.allclose(adv, torch.tensor([[r, r], [-r, -r], [0.0, 0.0], [0.0, 0.0]]))


def test_zero_variance_and_empty_responses_give_zeros_not_nan():
    adv, ret = reinforce_pp_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.ones(4, 3), group_size=2)
    assert torch.equal(adv, torch.zeros(4, 3)) and torch.equal(ret, torch.zeros(4, 3))
    adv, ret = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), torch.zeros(2, 3), kl=torch.ones(2, 3), kl_coef=0.1)
    assert torch.equal(adv, torch.zeros(2, 3)) and torch.equal(ret, torch.zeros(2, 3))
    # equal returns everywhere without a baseline: whitened to 0
    adv, _ = reinforce_pp_advantages(torch.tensor([1.0, 1.0]), torch.ones(2, 2))
    assert torch.equal(adv, torch.zeros(2, 2))


def test_outputs_carry_no_gradient_and_groups_are_checked():
    kl = torch.ones(2, 2, requires_grad=True)
    adv, ret = reinforce_pp_advantages(torch.tensor([1.0, 0.0]), torch.ones(2, 2), kl=kl, kl_coef=0.1)
    assert not adv.requires_grad and not ret.requires_grad
    with pytest.raises(ValueError, match="group_size"):
        reinforce_pp_advantages(torch.ones(3), torch.ones(3, 2), group_size=2)
