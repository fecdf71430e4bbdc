"""What generation writes into the dock under each ``train.old_log_prob`` / ``train.rollout_correction`` setting (and, with tools,
each trajectory's ``tool_record``), and which worker states then exist."""

import pytest
import torch
from tensordict import TensorDict

from dockflow.config import ConfigError, load_config
from dockflow.rollout.plain import dock_columns
from dockflow.workers.resources import build_plan


def _rollout() -> TensorDict:
    b, p, r = 2, 3, 4
    return TensorDict({
        "input_ids": torch.ones(b, p + r, dtype=torch.long), "attention_mask": torch.ones(b, p + r, dtype=torch.long),
        "responses": torch.ones(b, r, dtype=torch.long), "response_mask": torch.ones(b, r, dtype=torch.long),
        "prompt_length": torch.full((b,), p), "response_length": torch.full((b,), r),
        "rollout_log_prob": -torch.rand(b, r),
    }, batch_size=[b])


def test_recompute_writes_the_rollout_and_the_engine_log_probs_for_the_drift_metric():
    cfg = load_config("configs/grpo_arith.yaml")
    assert set(dock_columns(cfg, _rollout()).keys()) == {"input_ids", "attention_mask", "responses", "response_mask",
                                                         "rollout_log_prob"}
    # the actor_infer state compares them with the trainer's (rollout/logprob_abs_diff_*)
    assert {"rollout_log_prob", "response_mask"} <= set(build_plan(cfg).consumers()["actor_infer"])


def test_rollout_source_stores_the_engine_log_probs_as_old_log_prob_and_drops_the_pass():
    cfg = load_config("configs/grpo_arith.yaml", ["train.old_log_prob=rollout"])
    out = _rollout()
    cols = dock_columns(cfg, out)
    assert torch.equal(cols["old_log_prob"], out["rollout_log_prob"])
    assert "actor_infer" not in build_plan(cfg).consumers() and "old_log_prob" in build_plan(cfg).consumers()["actor_update"]


def test_rollout_correction_keeps_the_behaviour_log_probs_beside_the_recomputed_ones():
    cfg = load_config("configs/grpo_arith.yaml", ["train.rollout_correction.mode=sequence_mask"])
    cols = dock_columns(cfg, _rollout())
    assert "rollout_log_prob" in cols.keys() and "old_log_prob" not in cols.keys()
    assert "rollout_log_prob" in build_plan(cfg).consumers()["actor_update"]


@pytest.mark.parametrize("bad", [["train.rollout_correction.mode=token_truncate"], []])
def test_rollout_source_refuses_rollout_correction_and_dpo(bad):
    config = "configs/grpo_arith.yaml" if bad else "configs/dpo_arith.yaml"
    with pytest.raises(ConfigError, match="train.old_log_prob=rollout"):
        load_config(config, ["train.old_log_prob=rollout", *bad])


def test_tool_trajectories_carry_their_record_for_the_reward_functions():
    cfg = load_config("configs/grpo_calculator.yaml")
    out = _rollout()
    out["tool_record"] = torch.randint(0, 255, (2, 16), dtype=torch.uint8)
    cols = dock_columns(cfg, out)
    assert torch.equal(cols["tool_record"], out["tool_record"])
    assert "tool_record" in build_plan(cfg).consumers()["reward"]  # the reward worker reads it from the dock
