"""``train.rollout_correction``: every mode's weights and metrics against hand-computed values, the config group,
and the weights in the policy loss."""

import math

import pytest
import torch

from dockflow.algos.losses import clipped_policy_loss
from dockflow.algos.rollout_correction import rollout_correction
from dockflow.config import ConfigError, load_config
from dockflow.config.correction import RolloutCorrectionConfig

# Token ratios old / rollout: response 0 = [1, 5, 3] (3 tokens), response 1 = [0.5, 1, pad] (2 tokens).
# Sequence ratios (product): 15 and 0.5; geometric means: 15 ** (1/3) = 2.466 and 0.5 ** (1/2) = 0.7071.
OLD = torch.log(torch.tensor([[0.5, 0.5, 0.9], [0.2, 0.1, 0.7]]))
ROLLOUT = torch.log(torch.tensor([[0.5, 0.1, 0.3], [0.4, 0.1, 0.1]]))  # the padding's ratio (7) must not count
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
GEO = (15 ** (1 / 3), 0.5**0.5)


def _run(mode: str, cap: float, lower: float | None = None):
    return rollout_correction(OLD, ROLLOUT, MASK, RolloutCorrectionConfig(mode=mode, cap=cap, lower=lower))


# mode, cap, lower, token weights [2, 3], metrics: ratio mean, ratio max, share outside [lower, cap], weight mean
CASES = [
    ("token_truncate", 2.0, None, [[1, 2, 2], [0.5, 1, 0]], (2.1, 5.0, 2 / 5, 6.5 / 5)),  # the old tis_cap
    ("token_truncate", 2.0, 0.6, [[1, 2, 2], [0.6, 1, 0]], (2.1, 5.0, 3 / 5, 6.6 / 5)),
    ("token_mask", 4.0, 0.6, [[1, 0, 3], [0, 1, 0]], (2.1, 5.0, 2 / 5, 5 / 5)),
    ("sequence_truncate", 10.0, 0.6, [[10, 10, 10], [0.6, 0.6, 0]], (7.75, 15.0, 2 / 2, 31.2 / 5)),
    ("sequence_truncate", 20.0, None, [[15, 15, 15], [0.5, 0.5, 0]], (7.75, 15.0, 0 / 2, 46 / 5)),
    ("sequence_mask", 20.0, 0.6, [[15, 15, 15], [0, 0, 0]], (7.75, 15.0, 1 / 2, 45 / 5)),
    ("geometric_mask", 2.0, 0.6, [[0, 0, 0], [1, 1, 0]], (sum(GEO) / 2, GEO[0], 1 / 2, 2 / 5)),
    ("geometric_mask", 3.0, 0.8, [[1, 1, 1], [0, 0, 0]], (sum(GEO) / 2, GEO[0], 1 / 2, 3 / 5)),
]


@pytest.mark.parametrize(("mode", "cap", "lower", "weights", "stats"), CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_each_mode_matches_hand_computed_weights_and_metrics(mode, cap, lower, weights, stats):
    out = _run(mode, cap, lower)
    assert torch.allclose(out.weights, torch.tensor(weights, dtype=torch.float32), rtol=1e-5, atol=1e-6)
    share = "train/rollout_is_masked_share" if mode.endswith("mask") else "train/rollout_is_truncated_share"
    names = ("train/rollout_is_ratio_mean", "train/rollout_is_ratio_max", share, "train/rollout_is_weight_mean")
    assert set(out.metrics) == set(names)
    for name, value in zip(names, stats, strict=True):
        assert math.isclose(out.metrics[name], value, rel_tol=1e-5), name
    if mode.startswith("token"):
        assert out.sequence_weights is None
    else:  # one weight per response, the tokens' weight
        assert torch.allclose(out.sequence_weights, out.weights[:, 0])


def test_weights_carry_no_gradient_and_huge_log_ratios_stay_finite():
    old = torch.zeros(2, 3, requires_grad=True)
    rollout = torch.full((2, 3), -1000.0)  # log-ratio 1000 per token: clamped to 20 (token or response)
    for mode in ("token_truncate", "sequence_truncate", "sequence_mask"):
        out = rollout_correction(old, rollout, MASK, RolloutCorrectionConfig(mode=mode, cap=1e12))
        assert not out.weights.requires_grad and torch.isfinite(out.weights).all()
        assert math.isclose(out.metrics["train/rollout_is_ratio_max"], math.exp(20.0), rel_tol=1e-5)


def test_a_micro_batch_without_response_tokens_reports_zeros():
    out = rollout_correction(OLD, ROLLOUT, torch.zeros(2, 3), RolloutCorrectionConfig(mode="sequence_mask"))
    assert torch.equal(out.weights, torch.zeros(2, 3)) and set(out.metrics.values()) == {0.0}


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


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "geometric_mask"])
def test_a_config_with_each_mode_validates(mode):
    cfg = load_config("configs/grpo_arith.yaml", [f"train.rollout_correction.mode={mode}",
                                                   "train.rollout_correction.cap=1.001", "train.rollout_correction.lower=0.999"])
    rc = cfg.train.rollout_correction
    assert (rc.mode, rc.cap, rc.lower) == (mode, 1.001, 0.999)


@pytest.mark.parametrize(("value", "group"), [("2", "{mode: token_truncate, cap: 2}"), ("null", "{mode: null}")])
def test_the_old_tis_cap_key_says_what_to_write_instead(value, group):
    with pytest.raises(ConfigError) as err:
        load_config("configs/grpo_arith.yaml", [f"train.tis_cap={value}"])
    assert str(err.value) == (f"train.tis_cap was replaced by the train.rollout_correction group: write "
                              f"rollout_correction: {group} under train (token_truncate is what tis_cap did; "
                              "docs/algorithms.md, Rollout correction)")


@pytest.mark.parametrize(("overrides", "message"), [
    (["train.rollout_correction.mode=token_clip"], "invalid value for 'train.rollout_correction.mode'"),
    (["train.rollout_correction.cap=0"], "invalid value for 'train.rollout_correction.cap'"),
    (["train.rollout_correction.lower=3"], "train.rollout_correction.lower=3 must be below cap=2"),
])
def test_bad_settings_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("configs/grpo_arith.yaml", overrides)
