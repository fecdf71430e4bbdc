"""PPO pieces (token rewards, GAE, clipped value loss) and clip-higher against hand-computed cases."""

import math

import pytest
import torch

from dockflow.algos.losses import clipped_policy_loss
from dockflow.algos.ppo import clipped_value_loss, gae_advantages, outcome_token_rewards
from dockflow.algos.utils import last_token_index, masked_whiten


def test_outcome_reward_on_last_real_token_minus_kl():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    kl = torch.tensor([[0.1, 0.2, 9.0], [5.0, 5.0, 5.0], [0.0, 1.0, 2.0]])
    out = outcome_token_rewards(torch.tensor([1.0, 2.0, 3.0]), mask, kl, kl_coef=0.5)
    # row 0: reward 1 on index 1; kl -0.05, -0.1 on real tokens; padding stays 0 (its kl 9.0 ignored)
    # row 1: no real token -> nowhere for the reward, all 0; row 2: 3 - 0.5 * 2 = 2 on the last token
    expected = torch.tensor([[-0.05, 0.9, 0.0], [0.0, 0.0, 0.0], [0.0, -0.5, 2.0]])
    assert torch.allclose(out, expected)
    assert torch.equal(last_token_index(mask), torch.tensor([1, -1, 2]))
    plain = outcome_token_rewards(torch.tensor([1.0, 2.0, 3.0]), mask)
    assert torch.equal(plain, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 3.0]]))
    with pytest.raises(ValueError, match="kl"):
        outcome_token_rewards(torch.ones(3), mask, kl_coef=0.1)


def gae_case():
    rewards = outcome_token_rewards(torch.tensor([1.0, -1.0]), torch.tensor([[1, 1, 1], [1, 1, 0]]))
    values = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.4, 9.0]])  # 9.0 sits on padding: ignored
    return rewards, values, torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_gae_by_hand():
    # gamma = 0.9, lam = 0.8, gamma * lam = 0.72; V after the last real token is 0.
    # sample 0, r = [0, 0, 1], V = [0.5, 0.6, 0.7]:
    #   t=2: delta = 1 + 0 - 0.7 = 0.3                 A2 = 0.3
    #   t=1: delta = 0 + 0.9*0.7 - 0.6 = 0.03          A1 = 0.03 + 0.72*0.3   = 0.246
    #   t=0: delta = 0 + 0.9*0.6 - 0.5 = 0.04          A0 = 0.04 + 0.72*0.246 = 0.21712
    #   returns = A + V = [0.71712, 0.846, 1.0]
    # sample 1, r = [0, -1, pad], V = [0.2, 0.4, pad]:
    #   t=1: delta = -1 + 0 - 0.4 = -1.4               A1 = -1.4
    #   t=0: delta = 0 + 0.9*0.4 - 0.2 = 0.16          A0 = 0.16 + 0.72*(-1.4) = -0.848
    #   returns = [-0.648, -1.0, 0 (pad)]
    adv, ret = gae_advantages(*gae_case(), gamma=0.9, lam=0.8, whiten=False)
    assert torch.allclose(adv, torch.tensor([[0.21712, 0.246, 0.3], [-0.848, -1.4, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[0.71712, 0.846, 1.0], [-0.648, -1.0, 0.0]]))


def test_gae_whitened_over_real_tokens():
    # real advantages [0.21712, 0.246, 0.3, -0.848, -1.4]: mean -0.296976, biased var 0.487157474304,
    # std 0.697966671; (A - mean) / std below; the padded token stays 0, returns are not whitened.
    adv, ret = gae_advantages(*gae_case(), gamma=0.9, lam=0.8)
    expected = torch.tensor([[0.736562, 0.777940, 0.855307], [-0.789470, -1.580339, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5)
    assert torch.allclose(ret, torch.tensor([[0.71712, 0.846, 1.0], [-0.648, -1.0, 0.0]]))


def test_gae_with_gamma_lam_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 1.0, 1.5]])
    adv, ret = gae_advantages(rewards, values, torch.ones(1, 3), gamma=1.0, lam=1.0, whiten=False)
    assert torch.allclose(ret, torch.tensor([[2.0, 2.0, 2.0]]))
    assert torch.allclose(adv, torch.tensor([[1.5, 1.0, 0.5]]))


def test_gae_skips_a_hole_in_the_mask():
    # A masked token in the middle (a tool output) is skipped: same as the compacted response.
    holed, holed_ret = gae_advantages(
        torch.tensor([[0.0, 7.0, 1.0]]), torch.tensor([[0.5, 3.0, 0.7]]), torch.tensor([[1, 0, 1]]), 0.9, 0.8, whiten=False
    )
    compact, compact_ret = gae_advantages(
        torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.7]]), torch.ones(1, 2), 0.9, 0.8, whiten=False
    )
    assert torch.allclose(holed[:, [0, 2]], compact) and holed[0, 1] == 0.0
    assert torch.allclose(holed_ret[:, [0, 2]], compact_ret) and holed_ret[0, 1] == 0.0


def test_gae_all_masked_responses_give_zeros_not_nan():
    mask = torch.zeros(2, 3)
    adv, ret = gae_advantages(torch.ones(2, 3), torch.full((2, 3), 0.5), mask, 0.9, 0.8)
    assert torch.equal(adv, torch.zeros(2, 3)) and torch.equal(ret, torch.zeros(2, 3))
    # one empty row next to a real one: the empty row stays 0, the single real token whitens to 0
    adv, ret = gae_advantages(torch.ones(2, 2), torch.zeros(2, 2), torch.tensor([[1, 0], [0, 0]]), 0.9, 0.8)
    assert not adv.isnan().any() and torch.equal(adv, torch.zeros(2, 2))
    assert torch.equal(ret, torch.tensor([[1.0, 0.0], [0.0, 0.0]]))


def test_gae_outputs_carry_no_gradient():
    values = torch.tensor([[0.5, 0.6]], requires_grad=True)
    adv, ret = gae_advantages(torch.tensor([[0.0, 1.0]]), values, torch.ones(1, 2), 0.9, 0.8)
    assert not adv.requires_grad and not ret.requires_grad


def test_masked_whiten_constant_input_is_zero():
    out = masked_whiten(torch.full((2, 2), 3.0), torch.tensor([[1, 1], [1, 0]]))
    assert torch.equal(out, torch.zeros(2, 2))


def test_clipped_value_loss_by_hand():
    # token 0: V=1.0, old=0.0, R=0.9, c=0.2: unclipped (0.1)^2 = 0.01, clipped V=0.2 -> (0.7)^2 = 0.49
    #          max -> 0.49 (clipped branch, counted in clip_fraction, no gradient)  -> 0.5*0.49 = 0.245
    # token 1: V=0.1, old=0.0, R=1.0: within the clip range, both (0.9)^2 = 0.81 -> 0.405
    # token 2: padding (garbage values) is ignored. loss = (0.245 + 0.405) / 2 = 0.325
    values = torch.tensor([[1.0, 0.1, 50.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, -50.0]])
    returns = torch.tensor([[0.9, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, clip_fraction = clipped_value_loss(values, old, returns, mask, clip_range=0.2)
    assert loss.item() == pytest.approx(0.325)
    assert clip_fraction.item() == pytest.approx(0.5)
    loss.backward()
    # d/dV of 0.5 * (V - R)^2 / 2 tokens = (V - R) / 2 = -0.45 on token 1; 0 on the clipped and padded ones
    assert torch.allclose(values.grad, torch.tensor([[0.0, -0.45, 0.0]]))


def test_clipped_value_loss_micro_batches_and_empty():
    torch.manual_seed(0)
    values = torch.randn(4, 5, requires_grad=True)
    old = values.detach() + 0.3 * torch.randn(4, 5)
    returns = torch.randn(4, 5)
    mask = (torch.rand(4, 5) > 0.3).long()
    full, _ = clipped_value_loss(values, old, returns, mask, 0.2)
    tokens = float(mask.sum())
    parts = sum(
        clipped_value_loss(values[i : i + 2], old[i : i + 2], returns[i : i + 2], mask[i : i + 2], 0.2, token_denom=tokens)[0]
        for i in (0, 2)
    )
    assert parts.item() == pytest.approx(full.item(), rel=1e-6)
    loss, clip_fraction = clipped_value_loss(torch.ones(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), 0.2)
    assert loss.item() == 0.0 and clip_fraction.item() == 0.0


def test_clip_higher_is_asymmetric():
    # clip_eps (low) = 0.2, clip_eps_high = 0.28
    # token 0: adv +1, ratio 1.5 -> clipped at 1 + 0.28 -> -1.28
    # token 1: adv -1, ratio 0.5 -> clipped at 1 - 0.2   -> max(0.5, 0.8) = 0.8
    # token 2: adv +1, ratio 1.25: clipped by a symmetric 0.2 (-1.2) but inside 1.28 -> -1.25, with gradient
    logp = torch.tensor([[math.log(1.5)], [math.log(0.5)], [math.log(1.25)]], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 1.0])
    out = clipped_policy_loss(logp, torch.zeros(3, 1), adv, torch.ones(3, 1), clip_eps=0.2, clip_eps_high=0.28)
    assert out.loss.item() == pytest.approx((-1.28 + 0.8 - 1.25) / 3)
    assert out.clip_fraction.item() == pytest.approx(2 / 3)
    out.loss.backward()
    # d(-ratio)/dlogp = -ratio = -1.25, over 3 tokens; the clipped tokens get none
    assert torch.allclose(logp.grad, torch.tensor([[0.0], [0.0], [-1.25 / 3]]))
    symmetric = clipped_policy_loss(logp, torch.zeros(3, 1), adv, torch.ones(3, 1), clip_eps=0.2)
    assert symmetric.loss.item() == pytest.approx((-1.2 + 0.8 - 1.2) / 3)
    same = clipped_policy_loss(logp, torch.zeros(3, 1), adv, torch.ones(3, 1), clip_eps=0.2, clip_eps_high=0.2)
    assert same.loss.item() == symmetric.loss.item()
