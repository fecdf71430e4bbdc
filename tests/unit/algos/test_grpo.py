"""GRPO advantages and the clipped loss against small hand-computed cases."""

import math

import pytest
import torch

from dockflow.algos.groups import grpo_advantages
from dockflow.algos.kl import kl_penalty
from dockflow.algos.losses import clipped_policy_loss


def test_advantages_group_normalised_by_hand():
    # group [1,0,0,0]: mean 0.25, unbiased std 0.5 -> [1.5, -0.5, -0.5, -0.5]
    adv = grpo_advantages(torch.tensor([1.0, 0, 0, 0, 0, 1, 1, 0]), group_size=4, eps=0.0)
    assert torch.allclose(adv[:4], torch.tensor([1.5, -0.5, -0.5, -0.5]))
    # group [0,1,1,0]: mean 0.5, std sqrt(1/3)
    s = math.sqrt(1 / 3)
    assert torch.allclose(adv[4:], torch.tensor([-0.5, 0.5, 0.5, -0.5]) / s)


def test_advantages_zero_for_equal_rewards():
    adv = grpo_advantages(torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0]), group_size=4)
    assert torch.equal(adv, torch.zeros(8))


def test_advantages_without_std():
    adv = grpo_advantages(torch.tensor([1.0, 0, 0, 0]), group_size=4, norm_by_std=False)
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_advantages_reject_ragged_groups():
    with pytest.raises(ValueError, match="group_size"):
        grpo_advantages(torch.ones(6), group_size=4)


def test_on_policy_loss_is_minus_masked_mean_advantage():
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = clipped_policy_loss(logp, logp, torch.tensor([1.0, -1.0]), mask)
    # tokens: -1, -1 (row 0), +1 (row 1) over 3 real tokens
    assert out.loss.item() == pytest.approx(-1 / 3)
    assert out.clip_fraction.item() == 0.0


def test_masked_tokens_do_not_count():
    logp = torch.zeros(1, 3)
    old = torch.tensor([[0.0, 0.0, -50.0]])  # a padded position with a wild ratio
    out = clipped_policy_loss(logp, old, torch.tensor([1.0]), torch.tensor([[1, 1, 0]]))
    assert out.loss.item() == pytest.approx(-1.0)


def test_clipping_by_hand():
    old = torch.zeros(2, 1)
    logp = torch.tensor([[math.log(1.5)], [math.log(0.5)]])
    out = clipped_policy_loss(logp, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1), clip_eps=0.2)
    # adv>0, ratio 1.5 -> min(1.5, 1.2) * 1 -> loss -1.2; adv<0, ratio 0.5 -> loss max(0.5, 0.8) = 0.8
    assert out.loss.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert out.clip_fraction.item() == 1.0


def test_clipped_tokens_get_no_gradient():
    logp = torch.tensor([[math.log(1.5)]], requires_grad=True)
    clipped_policy_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1)).loss.backward()
    assert logp.grad.abs().item() == 0.0


def test_k3_kl_by_hand_and_nonnegative():
    logp, ref = torch.zeros(1), torch.tensor([math.log(0.5)])
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + math.log(2))
    x = torch.randn(100)
    assert (kl_penalty(x, torch.randn(100), "k3") >= 0).all()
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)


def test_kl_term_added_with_coefficient():
    logp = torch.zeros(1, 2)
    ref = torch.full((1, 2), math.log(0.5))
    out = clipped_policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), ref_logp=ref, kl_coef=0.1)
    assert out.loss.item() == pytest.approx(0.1 * (0.5 - 1 + math.log(2)))
    with pytest.raises(ValueError, match="ref_logp"):
        clipped_policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), kl_coef=0.1)


def test_micro_batches_sum_to_the_mini_batch_mean():
    torch.manual_seed(0)
    logp = torch.randn(4, 5, requires_grad=True)
    old = logp.detach() + 0.1 * torch.randn(4, 5)
    adv = torch.randn(4)
    mask = (torch.rand(4, 5) > 0.3).long()
    full = clipped_policy_loss(logp, old, adv, mask).loss
    (g_full,) = torch.autograd.grad(full, logp)
    tokens = float(mask.sum())
    parts = sum(clipped_policy_loss(logp[i : i + 2], old[i : i + 2], adv[i : i + 2], mask[i : i + 2], token_denom=tokens).loss for i in (0, 2))
    (g_parts,) = torch.autograd.grad(parts, logp)
    assert parts.item() == pytest.approx(full.item(), rel=1e-6)
    assert torch.allclose(g_full, g_parts, atol=1e-7)


def test_all_empty_responses_give_zero_loss_not_nan():
    out = clipped_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3))
    assert out.loss.item() == 0.0
