import math

import torch

from dockflow.algos.losses import clipped_policy_loss
from dockflow.algos.tis import truncated_is_weights


def test_weights_are_the_truncated_ratio_of_old_to_behaviour_policy():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.9], [0.2, 0.1, 0.3]]))
    behaviour = torch.log(torch.tensor([[0.5, 0.1, 0.3], [0.4, 0.1, 0.3]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = truncated_is_weights(old, behaviour, mask, cap=2.0)
    expected = torch.tensor([[1.0, 2.0, 2.0], [0.5, 1.0, 1.0]])  # 5 and 3 truncated to 2
    assert torch.allclose(out.weights, expected)
    assert math.isclose(float(out.mean), (1 + 2 + 2 + 0.5 + 1) / 5, rel_tol=1e-6)
    assert math.isclose(float(out.truncated_fraction), 2 / 5, rel_tol=1e-6)
    assert not out.weights.requires_grad


def test_weights_scale_each_tokens_policy_term_and_ones_change_nothing():
    logp = torch.randn(2, 3, requires_grad=True)
    old, adv, mask = torch.randn(2, 3), torch.tensor([1.0, -0.5]), torch.ones(2, 3)
    plain = clipped_policy_loss(logp, old, adv, mask).loss
    ones = clipped_policy_loss(logp, old, adv, mask, token_weights=torch.ones(2, 3)).loss
    assert torch.equal(plain, ones)
    w = torch.tensor([[2.0, 0.0, 1.0], [1.0, 1.0, 0.5]])
    weighted = clipped_policy_loss(logp, old, adv, mask, token_weights=w)
    ratio = torch.exp(logp - old)
    pg = torch.maximum(-adv[:, None] * ratio, -adv[:, None] * ratio.clamp(0.8, 1.2))
    assert torch.allclose(weighted.loss, (pg * w).mean())
