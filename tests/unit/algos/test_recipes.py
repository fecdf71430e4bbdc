"""Each algorithm's recipe: its advantage state (what the reward worker writes into the dock), the worker states it
runs and what they read, and the registry behind ``algorithm.name``."""

import pytest
import torch
from tensordict import TensorDict

from dockflow.algos import RECIPES, recipe_of
from dockflow.config import ConfigError, load_config
from dockflow.workers.resources import build_plan

MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0])


def cfg_for(name: str, *extra: str):
    overrides = [f"algorithm.name={name}", "rollout.group_size=2", "rollout.prompts_per_iter=2",
                 "train.mini_batch_size=2", "train.micro_batch_size=2"]
    return load_config(f"configs/{name}_arith.yaml", overrides + list(extra))


def batch(**columns) -> TensorDict:
    return TensorDict({"rewards": REWARDS, "response_mask": MASK, **columns}, batch_size=[4])


def compute_advantages(cfg, data, generator=None):
    return recipe_of(cfg.algorithm.name).advantages(cfg, data, generator)


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
    assert recipe_of(cfg.algorithm.name).advantage_batch_size(cfg) == cfg.global_batch
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
        ("gspo", {"reward", "advantage", "actor_infer", "actor_update"}),
        ("rloo", {"reward", "advantage", "actor_infer", "actor_update"}),
    ],
)
def test_each_algorithm_runs_only_its_worker_states(name, reads):
    overrides = ["rollout.group_size=2"] if name == "dpo" else []
    cfg = load_config(f"configs/{name}_arith.yaml", overrides)
    assert set(build_plan(cfg).consumers()) == reads


def test_dynamic_sampling_scores_only_groups_that_got_advantages():
    cols = build_plan(load_config("configs/dapo_arith.yaml")).consumers()
    assert "advantages" in cols["actor_infer"]
    no_ds = build_plan(load_config("configs/dapo_arith.yaml", ["algorithm.dapo.dynamic_sampling=false"])).consumers()
    assert "advantages" not in no_ds["actor_infer"]


def test_the_registry_knows_every_example_config_and_refuses_unknown_names():
    assert set(RECIPES) == {"grpo", "ppo", "dapo", "pf_ppo", "reinforce_pp", "reinforce_pp_baseline", "dpo", "gspo", "rloo",
                            "dr_grpo", "cispo"}
    for name, recipe in RECIPES.items():
        assert recipe.name == name and recipe.section.model_fields["name"].default in (name, "reinforce_pp")
    with pytest.raises(ValueError, match="unknown algorithm 'trpo'"):
        recipe_of("trpo")
    with pytest.raises(ConfigError, match=r"unknown algorithm.name 'trpo': one of \['cispo', 'dapo'"):
        load_config("configs/grpo_arith.yaml", ["algorithm.name=trpo"])


def test_a_section_holds_only_its_algorithms_keys():
    """The ``algorithm:`` section is the chosen algorithm's own: another algorithm's knob is an unknown key."""
    with pytest.raises(ConfigError, match=r"unknown config key 'algorithm.dapo'"):
        load_config("configs/grpo_arith.yaml", ["algorithm.dapo.max_rounds=2"])
    with pytest.raises(ConfigError, match=r"unknown config key 'algorithm.clip_eps'"):
        load_config("configs/dpo_arith.yaml", ["algorithm.clip_eps=0.1"])
    switched = load_config("configs/grpo_arith.yaml", ["algorithm.name=ppo"])
    assert switched.algorithm.ppo.lam == 0.95  # the PPO section's own defaults, the file's shared keys kept
    to_dpo = load_config("configs/grpo_arith.yaml", ["algorithm.name=dpo", "rollout.group_size=2", "train.mini_batch_size=64",
                                                     "train.micro_batch_size=64"])
    assert not hasattr(to_dpo.algorithm, "clip_eps")  # the file's GRPO keys DPO does not have are left behind


def test_rloo_subtracts_the_mean_of_the_other_responses():
    # groups (1, 0) and (1, 1): leave-one-out baselines 0, 1 and 1, 1 -> advantages 1, -1, 0, 0
    cfg = cfg_for("rloo")
    kept, out = compute_advantages(cfg, batch())
    assert kept.tolist() == [0, 1, 2, 3]
    assert torch.equal(out["advantages"], torch.tensor([1.0, -1.0, 0.0, 0.0]).unsqueeze(-1) * MASK)
    cfg4 = load_config("configs/rloo_arith.yaml", ["rollout.group_size=4", "rollout.prompts_per_iter=1",
                                                   "train.mini_batch_size=4", "train.micro_batch_size=4"])
    # one group (1, 0, 1, 1): baselines 2/3, 1, 2/3, 2/3 -> advantages 1/3, -1, 1/3, 1/3 (they sum to 0)
    _, out = compute_advantages(cfg4, batch())
    assert torch.allclose(out["advantages"][:, 0] * MASK[:, 0], torch.tensor([1 / 3, -1.0, 1 / 3, 0.0]))


def test_rloo_puts_the_summed_kl_into_the_reward():
    # kl_coef 0.5, k1 KL = old - ref log-probs = 0.2 per real token: response 0 (2 tokens) loses 0.2,
    # response 1 (1 token) 0.1 -> rewards 0.8, -0.1 -> advantages 0.9, -0.9
    cfg = cfg_for("rloo", "algorithm.kl_coef=0.5", "algorithm.kl_estimator=k1")
    assert recipe_of(cfg.algorithm.name).kl_in_reward(cfg) and "ref_log_prob" in build_plan(cfg).consumers()["advantage"]
    data = batch(old_log_prob=torch.full((4, 3), -1.0), ref_log_prob=torch.full((4, 3), -1.2))
    _, out = compute_advantages(cfg, data)
    assert torch.allclose(out["advantages"][:2, 0], torch.tensor([0.9, -0.9]))
    with pytest.raises(ConfigError, match="rollout.group_size >= 2"):
        load_config("configs/rloo_arith.yaml", ["rollout.group_size=1", "train.mini_batch_size=32",
                                                "train.micro_batch_size=32"])
