import pytest
import torch
from tensordict import TensorDict

from dockflow.config import ConfigError, load_config
from dockflow.flow.idle import IdleTracker
from dockflow.flow.iteration import shares
from dockflow.flow.metrics import pop_generated, rollout_summary
from dockflow.rollout.plain import clipped_rows, rollout_metrics
from dockflow.workers.resources import build_plan


def test_shares_split_prompts_contiguously_and_nearly_evenly():
    assert shares(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert shares(2, 3) == [(0, 1), (1, 2), (2, 2)]
    assert shares(8, 1) == [(0, 8)]


def test_generations_of_several_workers_merge_into_one_round():
    results = {
        "generate/0": {"rollout/samples": 8.0, "rollout/prompt_length": 4.0, "rollout/response_length": 2.0,
                       "rollout/tokens": 48.0, "timing/generate_s": 1.0, "rollout/policy_version": 3.0},
        "generate/1": {"rollout/samples": 4.0, "rollout/prompt_length": 1.0, "rollout/response_length": 5.0,
                       "rollout/tokens": 24.0, "timing/generate_s": 3.0, "rollout/policy_version": 2.0},
        "reward": {"reward/mean": 0.5},
    }
    merged = pop_generated(results)
    assert list(results) == ["reward"]
    assert merged == {"rollout/samples": 12.0, "rollout/tokens": 72.0, "timing/generate_s": 3.0,
                      "timing/generate_busy_s": 4.0, "rollout/prompt_length": 3.0,
                      "rollout/response_length": 3.0, "rollout/policy_version": 2.0}


def test_the_clipped_ratio_is_a_sample_weighted_mean_over_generators_and_rounds():
    base = {"rollout/prompt_length": 1.0, "rollout/response_length": 1.0, "rollout/tokens": 1.0,
            "timing/generate_s": 1.0}
    parts = [rollout_metrics(10, 30, 6, 0.0, clipped=3), rollout_metrics(10, 30, 2, 0.0, clipped=0)]
    assert [p["rollout/clipped_ratio"] for p in parts] == [0.5, 0.0]
    merged = pop_generated({"generate/0": {**base, **parts[0]}, "generate/1": {**base, **parts[1]}})
    assert merged["rollout/clipped_ratio"] == 3 / 8
    assert rollout_summary([merged, {**merged, "rollout/clipped_ratio": 0.125}], 8)["rollout/clipped_ratio"] == 0.25
    batch = TensorDict({"responses": torch.zeros(3, 4), "response_length": torch.tensor([4, 2, 4])}, batch_size=[3])
    assert clipped_rows(batch) == 2  # filled the width: cut at the limit


def test_tool_metrics_of_several_generators_are_sample_weighted_means():
    base = {"rollout/prompt_length": 1.0, "rollout/response_length": 1.0, "rollout/tokens": 1.0,
            "timing/generate_s": 1.0}
    results = {
        "generate/0": {**base, "rollout/samples": 6.0, "tools/turns": 2.0, "tools/tool_errors": 1.0},
        "generate/1": {**base, "rollout/samples": 2.0, "tools/turns": 4.0},
    }
    merged = pop_generated(results)
    assert merged["tools/turns"] == 2.5 and merged["tools/tool_errors"] == 1.0
    assert rollout_summary([merged, {**merged, "tools/turns": 1.5}], 8)["tools/turns"] == 2.0


def test_idle_fractions_count_dock_waits_as_idle():
    cfg = load_config("configs/grpo_arith.yaml", ["placement.mode=disaggregated", "placement.generators=2"])
    idle = IdleTracker.for_placement(cfg)
    first = idle.add({"timing/generate_busy_s": 4.0, "timing/old_log_prob_s": 1.0, "timing/update_s": 3.0,
                      "timing/update_wait_s": 2.0}, seconds=4.0)
    assert first == {"flow/idle_trainer": 0.5, "flow/idle_generator": 0.5}
    second = idle.add({"timing/generate_busy_s": 8.0, "timing/update_s": 4.0}, seconds=4.0)
    assert second == {"flow/idle_trainer": 0.25, "flow/idle_generator": 0.25}  # cumulative over 8 s
    colocated = IdleTracker.for_placement(load_config("configs/grpo_arith.yaml"))
    assert colocated.add({"timing/generate_busy_s": 1.0, "timing/update_s": 1.0}, seconds=4.0) == {"flow/idle_actor": 0.5}


def test_disaggregated_placement_refuses_offline_and_dynamic_sampling_algorithms():
    with pytest.raises(ConfigError, match="placement.mode=disaggregated"):
        load_config("configs/dpo_arith.yaml", ["placement.mode=disaggregated"])
    with pytest.raises(ConfigError, match="dynamic sampling"):
        load_config("configs/dapo_arith.yaml", ["placement.mode=disaggregated"])
    cfg = load_config("configs/grpo_arith.yaml", ["placement.mode=disaggregated", "train.max_staleness=2"])
    assert build_plan(cfg).dock_capacity == 3 * cfg.global_batch


def test_one_staleness_rule_for_both_drivers():
    """A colocated actor cannot generate ahead of its own update: refused at config load, so ``dockflow train``
    and the pipeline's setup refuse the same configs."""
    with pytest.raises(ConfigError, match="train.max_staleness=1 with placement.mode=colocated"):
        load_config("configs/dapo_arith.yaml", ["train.max_staleness=1"])


def test_partial_rollout_and_tis_refuse_what_they_cannot_run():
    with pytest.raises(ConfigError, match="rollout.partial.token_budget"):
        load_config("configs/grpo_arith.yaml", ["rollout.partial.token_budget=4"])
    with pytest.raises(ConfigError, match="train.rollout_correction.mode=token_truncate weights generated tokens"):
        load_config("configs/dpo_arith.yaml", ["train.rollout_correction.mode=token_truncate"])
    cfg = load_config("configs/grpo_arith_async.yaml",
                      ["rollout.partial.token_budget=4", "train.rollout_correction.mode=token_truncate"])
    assert cfg.rollout.partial.token_budget == 4 and cfg.train.rollout_correction.mode == "token_truncate"
