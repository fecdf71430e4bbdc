"""CISPO's loss (``dockflow.algos.cispo``): against a hand computation, and against TRL 1.16's own formula for
``loss_type="cispo"`` (``GRPOTrainer._compute_loss`` is a trainer method that needs a model, so its lines are
reimplemented below, with their place in TRL)."""

import math

import pytest
import torch
from tensordict import TensorDict

from dockflow.algos import recipe_of
from dockflow.algos.cispo import cispo_loss
from dockflow.config import load_config


def trl_cispo_loss(per_token_logps, old_per_token_logps, advantages, mask, *, epsilon_high, beta=0.0, ref=None,
                   num_items_in_batch=None):
    """TRL 1.16, trl/trainer/grpo_trainer.py, GRPOTrainer._compute_loss with importance_sampling_level="token",
    one process, no accumulation: lines 3083-3095 (the ratio), 3100-3102 (k3 KL), 3109-3111 (cispo's term),
    3150 (beta x KL), 3168-3174 (the sum over the batch's active tokens, ``num_items_in_batch``)."""
    log_ratio = per_token_logps - old_per_token_logps
    coef_1 = torch.exp(log_ratio)
    clamped_ratios = torch.clamp(coef_1, max=epsilon_high).detach()
    per_token_loss = -clamped_ratios * advantages.unsqueeze(-1) * per_token_logps
    if beta != 0.0:
        per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
        per_token_loss = per_token_loss + beta * per_token_kl
    normalizer = (mask.sum() if num_items_in_batch is None else torch.tensor(num_items_in_batch)).clamp(min=1.0)
    return (per_token_loss * mask).sum() / normalizer


def test_hand_computation_one_token_clipped_one_not():
    # token 0: ratio e^0.1 < 5, weight e^0.1; token 1: ratio e^2 > 5, weight 5 (detached either way)
    logp = torch.tensor([[-1.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.1, -2.5]])
    out = cispo_loss(logp, old, torch.tensor([2.0]), torch.ones(1, 2), epsilon_high=5.0)
    w0 = math.exp(0.1)
    expected = (-w0 * 2.0 * -1.0 + -5.0 * 2.0 * -0.5) / 2
    assert math.isclose(float(out.loss.detach()), expected, rel_tol=1e-6)
    out.loss.backward()
    # REINFORCE-style: d/dlogp = -w * A / tokens, the weight carries no gradient
    assert torch.allclose(logp.grad, torch.tensor([[-w0 * 2.0 / 2, -5.0 * 2.0 / 2]]))
    assert math.isclose(float(out.clip_fraction), 0.5)  # token 1: weight truncated with A > 0


def test_matches_trls_cispo_formula_with_kl_and_a_mini_batch_denominator():
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(4, 6, generator=g) * 3).requires_grad_()
    old = logp.detach() + torch.randn(4, 6, generator=g) * 0.8
    ref = logp.detach() + torch.randn(4, 6, generator=g) * 0.3
    adv = torch.randn(4, generator=g)
    mask = torch.ones(4, 6)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    for eps_high, beta, denom in [(5.0, 0.0, None), (1.2, 0.05, None), (1.5, 0.0, 40.0)]:
        ours = cispo_loss(logp, old, adv, mask, epsilon_high=eps_high, ref_logp=ref, kl_coef=beta, token_denom=denom)
        theirs = trl_cispo_loss(logp, old, adv, mask, epsilon_high=eps_high, beta=beta, ref=ref, num_items_in_batch=denom)
        assert torch.allclose(ours.loss, theirs, rtol=1e-6, atol=1e-7)
        g_ours = torch.autograd.grad(ours.loss, logp)[0]
        g_theirs = torch.autograd.grad(theirs, logp)[0]
        assert torch.allclose(g_ours, g_theirs, rtol=1e-5, atol=1e-7)


def test_recipe_uses_group_advantages_and_its_epsilon_high():
    cfg = load_config("configs/cispo_arith.yaml", ["rollout.group_size=2", "rollout.prompts_per_iter=2",
                                                   "train.mini_batch_size=2", "train.micro_batch_size=2",
                                                   "algorithm.cispo.epsilon_high=1.5"])
    recipe = recipe_of(cfg.algorithm.name)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    data = TensorDict({"rewards": torch.tensor([1.0, 0.0, 1.0, 1.0]), "response_mask": mask}, batch_size=[4])
    kept, out = recipe.advantages(cfg, data)
    assert kept.tolist() == [0, 1, 2, 3] and out["advantages"][0, 0] > 0 > out["advantages"][1, 0]
    logp = torch.full((4, 3), -1.0, requires_grad=True)
    micro = TensorDict({"old_log_prob": torch.full((4, 3), -2.0), "advantages": out["advantages"],
                        "response_mask": mask}, batch_size=[4])
    loss, metrics = recipe.policy_loss(cfg, logp, micro, float(mask.sum()))
    expected = cispo_loss(logp, micro["old_log_prob"], out["advantages"], mask, epsilon_high=1.5,
                          token_denom=float(mask.sum()))
    assert torch.equal(loss, expected.loss) and metrics["train/clip_fraction"] > 0
    assert {"train/pg_loss", "train/kl", "train/clip_fraction", "train/approx_kl_old", "train/loss"} <= set(metrics)


def test_kl_needs_the_reference_log_probs():
    with pytest.raises(ValueError, match="needs ref_logp"):
        cispo_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), kl_coef=0.1)
