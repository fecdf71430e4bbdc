"""DPO loss, implicit rewards and sequence log-probs, by hand."""

import math

import pytest
import torch

from dockflow.algos.dpo import dpo_loss, sequence_log_probs


def test_sequence_log_probs_is_the_masked_sum():
    token_logp = torch.tensor([[-1.0, -2.0, -50.0], [-0.5, -0.5, -0.5], [-3.0, -3.0, -3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    assert torch.allclose(sequence_log_probs(token_logp, mask), torch.tensor([-3.0, -1.5, 0.0]))


PAIRS = dict(
    policy_chosen=torch.tensor([-1.0, -2.0]),
    policy_rejected=torch.tensor([-3.0, -1.0]),
    ref_chosen=torch.tensor([-2.0, -1.5]),
    ref_rejected=torch.tensor([-2.0, -1.5]),
)


def test_dpo_loss_by_hand():
    # h = (pc - pr) - (rc - rr) = [2, -1]; beta 0.5 -> logits [1, -0.5]
    # loss = mean(log(1 + e^-1), log(1 + e^0.5)) = mean(0.313262, 0.974077) = 0.643669
    out = dpo_loss(**PAIRS, beta=0.5)
    assert out.loss.item() == pytest.approx((math.log1p(math.exp(-1)) + math.log1p(math.exp(0.5))) / 2)
    # rewards beta * (pi - ref): chosen [0.5, -0.25], rejected [-0.5, 0.25]
    assert out.chosen_reward.item() == pytest.approx(0.125)
    assert out.rejected_reward.item() == pytest.approx(-0.125)
    assert out.reward_accuracy.item() == pytest.approx(0.5)
    # margin of the policy log-probs: mean(2, -1)
    assert out.margin.item() == pytest.approx(0.5)


def test_conservative_label_smoothing_by_hand():
    # first pair only, logits 1: 0.9 * log(1 + e^-1) + 0.1 * log(1 + e^1) = 0.413262
    one = {k: v[:1] for k, v in PAIRS.items()}
    out = dpo_loss(**one, beta=0.5, label_smoothing=0.1)
    assert out.loss.item() == pytest.approx(0.9 * math.log1p(math.exp(-1)) + 0.1 * math.log1p(math.exp(1)))
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(**one, beta=0.5, label_smoothing=0.6)


def test_gradient_reaches_the_policy_only():
    pc = PAIRS["policy_chosen"].clone().requires_grad_()
    pr = PAIRS["policy_rejected"].clone().requires_grad_()
    out = dpo_loss(pc, pr, PAIRS["ref_chosen"], PAIRS["ref_rejected"], beta=0.5)
    out.loss.backward()
    # d/dh of -logsigmoid(beta h) = -beta * sigmoid(-beta h); mean over 2 pairs
    sig = torch.sigmoid(-torch.tensor([1.0, -0.5]))
    assert torch.allclose(pc.grad, -0.5 * sig / 2)
    assert torch.allclose(pr.grad, 0.5 * sig / 2)
    assert not out.chosen_reward.requires_grad and not out.margin.requires_grad


def test_token_log_probs_to_loss_end_to_end_is_the_mean_over_pairs():
    torch.manual_seed(0)
    logp = torch.randn(4, 5, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    seq = sequence_log_probs(logp, mask)
    ref = torch.randn(4)
    full = dpo_loss(seq[:2], seq[2:], ref[:2], ref[2:], beta=0.1)
    pairs = [dpo_loss(seq[i : i + 1], seq[2 + i : 3 + i], ref[i : i + 1], ref[2 + i : 3 + i], 0.1).loss for i in (0, 1)]
    assert (sum(pairs) / 2).item() == pytest.approx(full.loss.item())
    full.loss.backward()
    assert torch.equal(logp.grad[mask == 0], torch.zeros(int((mask == 0).sum())))
    assert (logp.grad[mask == 1] != 0).all()


def test_empty_batch_gives_zero_not_nan():
    empty = torch.zeros(0)
    out = dpo_loss(empty, empty, empty, empty, beta=0.1)
    assert out.loss.item() == 0.0 and out.reward_accuracy.item() == 0.0
