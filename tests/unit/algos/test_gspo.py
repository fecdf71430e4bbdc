"""GSPO's sequence-level ratio, clip and loss against hand-computed cases (Zheng et al., 2025)."""

import math

import pytest
import torch

from dockflow.algos.gspo import gspo_loss
from dockflow.config import ConfigError, load_config

MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_the_ratio_is_the_length_normalised_sequence_ratio():
    # response 0: log ratios 0.2, 0.0 (2 tokens) -> mean 0.1 -> s = e^0.1; response 1: 0.3 (1 token) -> s = e^0.3.
    # The third column is padding: its huge log ratio must not count.
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.2, 0.0, 9.0], [0.3, 9.0, 9.0]])
    out = gspo_loss(logp, old, torch.tensor([1.0, 1.0]), MASK, clip_low=1.0, clip_high=1.0)  # a wide clip: no clipping
    assert torch.allclose(out["log_ratio"], torch.tensor([0.1, 0.3]))
    # A = 1: per-sequence loss -s_i; a mean over the 2 responses.
    assert math.isclose(float(out["loss"]), -(math.exp(0.1) + math.exp(0.3)) / 2, rel_tol=1e-6)
    assert float(out["clip_fraction"]) == 0.0


def test_sequence_level_clipping_with_the_papers_tiny_range():
    # s = e^0.1 = 1.105 > 1 + 4e-4 with A > 0: clipped to 1.0004, and no gradient flows through it;
    # A < 0 with s > 1 + eps: the unclipped (larger) loss wins and keeps its gradient.
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.1, 0.1, 0.0], [0.1, 0.0, 0.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]])  # per-token, broadcast like the dock's advantages
    out = gspo_loss(logp, old, adv, MASK, clip_low=3e-4, clip_high=4e-4, sequences=4)
    expected = (-1.0 * (1 + 4e-4) + 1.0 * math.exp(0.1)) / 4  # over the mini-batch's 4 responses
    assert math.isclose(float(out["loss"]), expected, rel_tol=1e-5)
    assert float(out["clip_fraction"]) == 0.5
    out["loss"].backward()
    assert torch.count_nonzero(logp.grad[0]) == 0  # the clipped response
    # d/dlogp_t of e^{mean log ratio} / 4 for the one real token of response 1: e^0.1 / 1 / 4
    assert math.isclose(float(logp.grad[1, 0]), math.exp(0.1) / 4, rel_tol=1e-5)


def test_a_response_with_no_tokens_adds_nothing():
    out = gspo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([5.0, 1.0]), torch.tensor([[0, 0, 0], [1, 0, 0]]),
                    clip_low=3e-4, clip_high=4e-4)
    assert math.isclose(float(out["loss"]), -1.0, rel_tol=1e-6)  # only response 1 (s = 1, A = 1) counts


def test_gspo_config_defaults_are_the_papers_and_refuse_token_weights():
    cfg = load_config("configs/gspo_arith.yaml")
    assert cfg.algorithm.clip_eps == pytest.approx(3e-4) and cfg.algorithm.gspo.clip_eps_high == pytest.approx(4e-4)
    with pytest.raises(ConfigError, match="mode=token_mask weights tokens, but GSPO's importance ratio is per response"):
        load_config("configs/gspo_arith.yaml", ["placement.mode=disaggregated", "train.rollout_correction.mode=token_mask"])
    for mode in ("sequence_truncate", "sequence_mask", "geometric_mask"):  # one weight per response: GSPO takes it
        cfg = load_config("configs/gspo_arith.yaml", [f"train.rollout_correction.mode={mode}"])
        assert cfg.train.rollout_correction.mode == mode


def test_sequence_weights_scale_each_responses_term():
    logp, old, adv = torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([1.0, 2.0])
    out = gspo_loss(logp, old, adv, MASK, clip_low=3e-4, clip_high=4e-4, sequence_weights=torch.tensor([0.5, 0.0]))
    assert math.isclose(float(out["loss"]), -(1.0 * 0.5 + 2.0 * 0.0) / 2, rel_tol=1e-6)  # s = 1: -A_i x w_i
