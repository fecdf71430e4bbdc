"""Dr. GRPO (Liu et al., 2025) against hand-computed cases: no std in the advantage, a constant loss denominator."""

import math

import torch
from tensordict import TensorDict

from dockflow.algos import recipe_of
from dockflow.config import load_config
from dockflow.workers.resources import build_plan

MASK = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]])


def config(*extra: str):
    overrides = ["rollout.group_size=2", "rollout.prompts_per_iter=2", "rollout.max_new_tokens=4",
                 "train.mini_batch_size=4", "train.micro_batch_size=4"]
    return load_config("configs/dr_grpo_arith.yaml", overrides + list(extra))


def test_advantage_is_the_reward_minus_the_group_mean_without_the_std():
    cfg = config()
    data = TensorDict({"rewards": torch.tensor([1.0, 0.0, 3.0, 1.0]), "response_mask": MASK}, batch_size=[4])
    kept, out = recipe_of(cfg.algorithm.name).advantages(cfg, data)
    assert kept.tolist() == [0, 1, 2, 3]
    # groups (1, 0) and (3, 1): centred 0.5/-0.5 and 1/-1, not divided by their std (GRPO would give +-0.707 both)
    assert torch.allclose(out["advantages"][:, 0], torch.tensor([0.5, -0.5, 1.0, -1.0]))
    assert torch.equal(out["advantages"] != 0, MASK.bool())
    grpo = config("algorithm.norm_adv_by_std=true")
    _, normed = recipe_of(grpo.algorithm.name).advantages(grpo, data)
    assert not torch.allclose(normed["advantages"][:, 0], out["advantages"][:, 0])


def test_loss_divides_by_responses_times_the_generation_budget_not_by_tokens():
    cfg = config()
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4, [2.0] * 4, [0.5] * 4]) * MASK
    logp = torch.zeros(4, 4, requires_grad=True)
    micro = TensorDict({"old_log_prob": torch.zeros(4, 4), "advantages": adv, "response_mask": MASK}, batch_size=[4])
    tokens = float(MASK.sum())  # 8: what GRPO divides by
    loss, metrics = recipe_of(cfg.algorithm.name).policy_loss(cfg, logp, micro, tokens)
    # ratio 1 everywhere: the surrogate of a token is -A; summed over real tokens = -(4 - 1 + 4 + 0.5) = -7.5,
    # over mini_batch_size x max_new_tokens = 16 (GRPO: over the 8 tokens)
    assert math.isclose(float(loss), -7.5 / 16, rel_tol=1e-6)
    loss.backward()
    # every real token's gradient is -A / 16 whatever its response's length: no length bias
    assert torch.allclose(logp.grad, -adv / 16)
    assert "train/pg_loss" in metrics
    grpo = load_config("configs/grpo_arith.yaml", ["rollout.group_size=2", "rollout.prompts_per_iter=2",
                                                   "train.mini_batch_size=4", "train.micro_batch_size=4"])
    grpo_loss, _ = recipe_of(grpo.algorithm.name).policy_loss(grpo, logp.detach(), micro, tokens)
    assert math.isclose(float(grpo_loss), -7.5 / 8, rel_tol=1e-6)


def test_it_runs_the_same_workers_as_grpo():
    ours, grpo = build_plan(config()), build_plan(load_config("configs/grpo_arith.yaml"))
    assert ours.roles.keys() == grpo.roles.keys() and ours.consumers() == grpo.consumers()
