"""The pure parts of ``benchmarks/vs_trl.py``: DockFlow's config mapped to TRL's GRPOConfig arguments, the
per-iteration Eq. (5) record both systems are summarized with, and the throughput-ratio verdict. Neither
system is run here (the benchmark needs minutes; see docs/vs_trl.md) and trl is not imported."""

from __future__ import annotations

import pytest

from benchmarks.trl_grpo import IterationStats, trl_arguments
from benchmarks.vs_trl import SETUPS, compare, dockflow_iteration, setup_config, summarize
from dockflow.config import load_config


def test_trl_arguments_match_the_demo_config():
    cfg = load_config("configs/grpo_arith.yaml", ["train.iterations=7"])
    args = trl_arguments(cfg, "out")
    # One generation of G x N = 256 completions, one optimizer step on all of it, per iteration.
    assert args["generation_batch_size"] == 256 and args["num_generations"] == 8
    assert args["per_device_train_batch_size"] == 256 and args["gradient_accumulation_steps"] == 1
    assert args["num_iterations"] == 1 and args["max_steps"] == 7
    assert args["max_completion_length"] == 8 and args["temperature"] == 1.0 and args["top_k"] == 0
    assert args["learning_rate"] == 2e-4 and args["lr_scheduler_type"] == "constant" and args["optim"] == "adamw_torch"
    assert args["epsilon"] == 0.2 and args["beta"] == 0.0 and args["loss_type"] == "dapo"
    assert args["max_grad_norm"] == 1.0 and args["weight_decay"] == 0.0
    assert not args["bf16"] and not args["gradient_checkpointing"] and not args["shuffle_dataset"]


def test_trl_arguments_map_mini_batches_and_epochs():
    cfg = load_config("configs/grpo_arith.yaml", ["train.iterations=3", "train.mini_batch_size=128",
                                                   "train.micro_batch_size=64", "train.epochs=2"])
    args = trl_arguments(cfg, "out")
    assert args["per_device_train_batch_size"] == 64 and args["gradient_accumulation_steps"] == 2
    assert args["num_iterations"] == 2 and args["max_steps"] == 3 * 2 * 2  # iterations x epochs x mini-batches


def test_trl_arguments_reject_what_trl_cannot_lay_out():
    with pytest.raises(ValueError, match="must divide"):
        trl_arguments(load_config("configs/grpo_arith.yaml", ["train.mini_batch_size=96"]), "out")
    with pytest.raises(ValueError, match="GRPO only"):
        trl_arguments(load_config("configs/ppo_arith.yaml"), "out")


def test_larger_setup_is_long_and_shared(tmp_path):
    cfg = setup_config(SETUPS["larger"], 2, str(tmp_path), [])
    assert cfg.rollout.max_new_tokens >= 256 and not cfg.sft.enabled
    assert cfg.model.path == str(tmp_path / "larger_model") and cfg.train.iterations == 2
    assert trl_arguments(cfg, "out")["max_completion_length"] == cfg.rollout.max_new_tokens


def test_summarize_applies_eq5_per_iteration_then_averages():
    its = [IterationStats(256, 8.0, 4.0, 2.0, 0.5, {"generate": 1.0, "update": 0.5}),
           IterationStats(256, 8.0, 8.0, 4.0, 0.7, {"generate": 3.0, "update": 0.5})]
    r = summarize("trl", "tiny", its, devices=2.0, accuracy_before=0.4, accuracy_after=0.5, wall_s=9.0)
    # 256 x (8 + 4) / 2 / 2 = 768 and 256 x (8 + 8) / 2 / 4 = 512
    assert r["tps_per_iteration"] == [768.0, 512.0] and r["tps"] == 640.0
    assert r["response_length"] == 6.0 and r["seconds_per_iteration"] == 3.0 and r["train_s"] == 6.0
    assert r["accuracy_gain"] == pytest.approx(0.1) and r["iterations"] == 2
    assert r["phase_s"]["generate"] == 2.0 and r["phase_s"]["other"] == pytest.approx(3.0 - 2.0 - 0.5)
    with pytest.raises(ValueError, match="no iterations"):
        summarize("trl", "tiny", [], devices=2.0, accuracy_before=0.0, accuracy_after=0.0, wall_s=1.0)


def test_dockflow_iteration_reads_the_sync_loop_metrics():
    metrics = {"rollout/samples": 256.0, "rollout/prompt_length": 8.0, "rollout/response_length": 3.5,
               "timing/iteration_s": 0.9, "reward/mean": 0.6, "timing/generate_s": 0.3, "timing/update_s": 0.4}
    it = dockflow_iteration(metrics)
    assert (it.samples, it.prompt_length, it.response_length, it.seconds, it.reward_mean) == (256, 8.0, 3.5, 0.9, 0.6)
    assert it.phases == {"generate": 0.3, "update": 0.4}


def test_dockflow_reward_phase_is_scoring_without_waiting_for_responses():
    metrics = {"rollout/samples": 256.0, "rollout/prompt_length": 8.0, "rollout/response_length": 3.5,
               "timing/iteration_s": 0.4, "reward/mean": 0.6, "timing/reward_s": 0.11, "timing/reward_wait_s": 0.1}
    assert dockflow_iteration(metrics).phases["reward"] == pytest.approx(0.01)


def test_compare_gives_the_ratio_and_both_verdicts():
    base = {"setup": "tiny", "accuracy_gain": 0.1}
    results = [{**base, "system": "dockflow", "tps": 300.0}, {**base, "system": "trl", "tps": 100.0, "accuracy_gain": 0.2},
               {**base, "setup": "larger", "system": "dockflow", "tps": 1.0}]
    (c,) = compare(results)  # "larger" has no TRL record: no comparison
    assert c["setup"] == "tiny" and c["tps_ratio"] == 3.0 and c["throughput_target_met"]
    assert not c["accuracy_target_met"]


def test_async_mode_is_disaggregated_on_the_same_two_devices(tmp_path):
    sync = setup_config(SETUPS["tiny"], 2, str(tmp_path), [], "sync")
    asy = setup_config(SETUPS["tiny"], 2, str(tmp_path), [], "async")
    assert sync.placement.mode == "colocated" and sync.ray.actor_cpus == 2
    assert asy.placement.mode == "disaggregated" and asy.train.max_staleness == 1
    assert asy.ray.actor_cpus + asy.placement.generators * asy.placement.generator_cpus == sync.ray.actor_cpus
    assert sync.run.name != asy.run.name  # separate run directories


def test_compare_takes_the_median_ratio_over_alternating_pairs():
    base = {"setup": "tiny", "accuracy_gain": 0.1, "mode": "sync"}
    results = []
    for pair, (df, trl) in enumerate([(90.0, 100.0), (120.0, 100.0), (105.0, 100.0)]):
        results += [{**base, "system": "dockflow", "pair": pair, "tps": df},
                    {**base, "system": "trl", "pair": pair, "tps": trl}]
    (c,) = compare(results)
    assert c["pairs"] == 3 and c["tps_ratios"] == [0.9, 1.2, 1.05]
    assert c["tps_ratio"] == 1.05 and c["throughput_target_met"] and not c["stretch_met"]


def test_compare_gives_each_systems_gain_at_each_seed():
    results = []
    for pair, (df, trl) in enumerate([(0.30, 0.20), (0.02, 0.25), (0.25, 0.22)]):
        results += [{"setup": "tiny", "mode": "sync", "system": "dockflow", "pair": pair, "seed": 7 + pair,
                     "tps": 1.0, "accuracy_gain": df},
                    {"setup": "tiny", "mode": "sync", "system": "trl", "pair": pair, "seed": 7 + pair, "tps": 1.0,
                     "accuracy_gain": trl}]
    (c,) = compare(results)
    assert c["gains_by_seed"] == [{"seed": 7, "dockflow": 0.30, "trl": 0.20}, {"seed": 8, "dockflow": 0.02, "trl": 0.25},
                                  {"seed": 9, "dockflow": 0.25, "trl": 0.22}]
    assert c["accuracy_gain_dockflow"] == 0.25 and c["accuracy_gain_trl"] == 0.22  # medians hide seed 8's stall


def test_compare_has_one_row_per_dockflow_mode():
    base = {"setup": "tiny", "accuracy_gain": 0.1}
    results = [{**base, "system": "dockflow", "mode": "sync", "tps": 50.0},
               {**base, "system": "dockflow", "mode": "async", "tps": 200.0},
               {**base, "system": "trl", "mode": "sync", "tps": 100.0}]
    rows = {c["mode"]: c for c in compare(results)}
    assert rows["sync"]["tps_ratio"] == 0.5 and not rows["sync"]["throughput_target_met"]
    assert rows["async"]["tps_ratio"] == 2.0 and rows["async"]["throughput_target_met"] and rows["async"]["stretch_met"]
