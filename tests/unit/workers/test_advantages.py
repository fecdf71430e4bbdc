"""The advantage state per algorithm (what the reward worker writes into the dock), and who reads what."""

import pytest
import torch
from tensordict import TensorDict

from dockflow.config import load_config
from dockflow.workers.advantages import advantage_batch_size, compute_advantages
from dockflow.workers.columns import consumers

MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0])


def cfg_for(name: str, *extra: str):
    overrides = [f"algorithm.name={name}", "rollout.group_size=2", "rollout.prompts_per_iter=2",
                 "train.mini_batch_size=2", "train.micro_batch_size=2"]
    return load_config(f"configs/{name}_arith.yaml", overrides + list(extra))


def batch(**columns) -> TensorDict:
    return TensorDict({"rewards": REWARDS, "response_mask": MASK, **columns}, batch_size=[4])


def test_grpo_family_broadcasts_group_advantages_over_real_tokens():
    cfg = cfg_for("dapo")
    kept, out = compute_advantages(cfg, batch())
    assert kept.tolist() == [0, 1, 2, 3]
    # group 0 = (1, 0): +-1/std; group 1 = (1, 1): no signal. Padding stays 0.
    adv = out["advantages"]
    assert adv[0, 0] > 0 and adv[1, 0] < 0 and torch.equal(adv[0, 2], torch.tensor(0.0))
    assert torch.count_nonzero(adv[2:]) == 0


def test_ppo_writes_advantages_and_returns_per_token():
    cfg = cfg_for("ppo", "algorithm.ppo.whiten_advantages=false", "algorithm.ppo.lam=1.0")
    kept, out = compute_advantages(cfg, batch(values=torch.zeros(4, 3)))
    assert kept.tolist() == [0, 1, 2, 3] and set(out.keys()) == {"advantages", "returns"}
    # gamma = lam = 1, values 0: every real token's return is the outcome reward.
    assert torch.equal(out["returns"], REWARDS.unsqueeze(-1) * MASK)


def test_pf_ppo_keeps_only_the_filtered_responses():
    cfg = cfg_for("pf_ppo", "algorithm.pf_ppo.keep=1", "algorithm.pf_ppo.mode=best")
    kept, out = compute_advantages(cfg, batch(values=torch.zeros(4, 3)), torch.Generator().manual_seed(0))
    assert kept.tolist() == [0, 2]  # the best of each pair (ties: lower index)
    assert out.batch_size[0] == 2


def test_reinforce_pp_normalises_over_the_whole_batch():
    cfg = cfg_for("reinforce_pp", "algorithm.kl_coef=0.0")
    assert advantage_batch_size(cfg) == cfg.global_batch
    _, out = compute_advantages(cfg, batch())
    real = out["advantages"][MASK.bool()]
    assert abs(float(real.mean())) < 1e-5


@pytest.mark.parametrize(
    ("name", "reads"),
    [
        ("grpo", {"reward", "advantage", "actor_infer", "actor_update"}),
        ("ppo", {"reward", "advantage", "actor_infer", "critic_infer", "actor_update", "critic_update"}),
        ("reinforce_pp", {"reward", "advantage", "actor_infer", "ref_infer", "actor_update"}),
        ("dpo", {"ref_infer", "actor_update"}),
    ],
)
def test_each_algorithm_runs_only_its_worker_states(name, reads):
    overrides = ["rollout.group_size=2"] if name == "dpo" else []
    cfg = load_config(f"configs/{name}_arith.yaml", overrides)
    assert set(consumers(cfg)) == reads


def test_dynamic_sampling_scores_only_groups_that_got_advantages():
    cols = consumers(load_config("configs/dapo_arith.yaml"))
    assert "advantages" in cols["actor_infer"]
    no_ds = consumers(load_config("configs/dapo_arith.yaml", ["algorithm.dapo.dynamic_sampling=false"]))
    assert "advantages" not in no_ds["actor_infer"]
