"""Every algorithm's example config, shrunk to the tiny task, runs 2 iterations end to end and trains.
Five runs also carry other features, to pay Ray's start-up once: REINFORCE++ runs disaggregated, one
version stale, with token-truncated rollout correction; PF-PPO trains its actor on 2 data-parallel
ranks (FSDP2, allgather-swap resharding, memory ledger) and resumes from its checkpoint; PPO trains its actor
and its critic with the megatron engine, iteration 1 on 2 tensor-parallel ranks each, iteration 2 resumed from that
checkpoint at TP=1 on 2 data-parallel megatron replicas; DPO trains the tiny Qwen3-MoE (from a fresh model: DPO's
offline pairs give a gradient without an SFT warm start); GSPO (which does not shape rewards) scores with a reward
model (a tiny one-label classifier built locally) beside the verifier: the reward-model worker scores every
rollout through the dock, and the combined reward holds its weighted score.

One local Ray cluster serves the whole module (``train`` joins it instead of starting its own).
"""

import io
import math
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

from dockflow.flow.run_checkpoint import read_record
from dockflow.flow.trainer import train
from dockflow.models.tiny_reward_model import build_tiny_reward_model
from dockflow.rollout.queue import checkpoint_types
from dockflow.storage import run_store
from dockflow.tracking import read_metric_history, resolve_tracking_uri
from dockflow.workers.resources import build_plan

pytestmark = pytest.mark.slow

# config -> metrics that only this algorithm logs (each must reach MLflow for both iterations). GRPO runs in
# test_train_loop.py; RLOO, Dr. GRPO and CISPO take GRPO's path through the workers with another advantage or loss
# normalisation, which their unit tests cover (tests/unit/algos/); `python -m benchmarks.algos` trains them all.
ALGORITHMS = {
    "ppo": ("critic/value_loss", "train/pg_loss"),
    "pf_ppo": ("critic/value_loss", "train/pg_loss"),
    "reinforce_pp": ("train/pg_loss",),  # its -baseline variant differs only in the advantage (unit-tested)
    "dpo": ("train/dpo_margin", "train/dpo_reward_accuracy"),
    "dapo": ("dapo/kept_groups", "dapo/rounds"),  # dynamic sampling: generate and score rounds in one generate task
    "gspo": ("train/seq_ratio_mean", "train/pg_loss"),  # the sequence-level ratio
}


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="test-algorithms")
    yield
    ray.shutdown()


def run_overrides(algorithm: str, tmp_path: Path) -> dict:
    """The config overrides of ``algorithm``'s run: the features it carries besides its own."""
    # The centralized dock is one actor instead of a controller per worker state: these tests are about the
    # algorithms (the distributed dock has its own tests and carries the GRPO run of test_train_loop).
    extra = {"dock__backend": "centralized"}
    if algorithm == "dpo":
        extra |= {"rollout__group_size": 2, "algorithm__dpo__num_eval_pairs": 10}
        extra |= {"model__tiny__architecture": "qwen3_moe", "model__tiny__num_experts": 4, "sft__enabled": False}
    if algorithm == "pf_ppo":
        extra["algorithm__pf_ppo__keep"] = 2  # G x keep = 8 = one mini-batch
        extra["train__dp"] = 2
    if algorithm == "ppo":  # also the megatron engine: 2 actor and 2 critic ranks, each model split by TP (then DP)
        extra |= {"train__engine": "megatron", "train__tp": 2}
    if algorithm == "reinforce_pp":  # also the asynchronous scheduler: a generator worker runs one version ahead
        extra |= {"placement__mode": "disaggregated", "train__max_staleness": 1, "placement__generator_cpus": 0}
        # truncated IS against the generator's log-probs (one version behind)
        extra |= {"train__rollout_correction__mode": "token_truncate", "train__rollout_correction__cap": 2.0}
    if algorithm == "gspo":  # also a reward model beside the verifier, on its own worker (1 CPU, as the actor)
        rm_dir = build_tiny_reward_model(tmp_path / "tiny-rm")
        extra |= {"reward__models": f"[{{path: {rm_dir}, weight: 0.5}}]", "reward__model_cpus": 1,
                  "reward__model_batch_size": 4}
    return extra


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_two_iterations_train_the_policy(algorithm, ray_cluster, tiny_config, tmp_path):
    extra = run_overrides(algorithm, tmp_path)
    # PPO's megatron run: iteration 1 at TP=2, then iteration 2 resumed from its checkpoint at TP=1 x DP=2
    cfg = tiny_config(algorithm, 1 if algorithm == "ppo" else 2, config=f"configs/{algorithm}_arith.yaml", **extra)
    rank_weights: list[list[dict]] = []
    critics: list[list[str]] = []  # the critic workers Ray holds after each iteration

    def after_iteration(step: int, _) -> None:
        rank_weights.append(policy_of_each_rank(cfg))
        critics.append(critic_workers(cfg))

    summary = train(cfg, on_iteration=after_iteration)
    if algorithm == "ppo":
        cfg = tiny_config(algorithm, 2, config=f"configs/{algorithm}_arith.yaml",
                          **(extra | {"train__tp": 1, "train__dp": 2}))
        summary = train(cfg, resume=True, on_iteration=after_iteration)
        assert summary["resumed_from"] == 1

    assert summary["iterations"] == 2 and summary["algorithm"] == algorithm
    before = load_file(str(Path(summary["initial_model"]) / "model.safetensors"))
    after = load_file(str(Path(summary["final_model"]) / "model.safetensors"))
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert not unchanged, f"{algorithm} left parameters unchanged: {unchanged}"
    uri = resolve_tracking_uri(cfg.tracking.uri, cfg.run.output_dir)
    for key in ALGORITHMS[algorithm] + ("perf/throughput_tps", "timing/update_s"):
        history = read_metric_history(uri, summary["mlflow_run_id"], key)
        assert [s for s, _ in history] == [1, 2], key
        assert all(v == v for _, v in history), f"{key} is NaN"
    if algorithm == "reinforce_pp":
        ages = read_metric_history(uri, summary["mlflow_run_id"], "staleness/max")
        assert [v for _, v in ages] == [0.0, 1.0]  # iteration 2 was generated before update 1 finished
        assert read_metric_history(uri, summary["mlflow_run_id"], "flow/idle_generator")
        tis = [v for _, v in read_metric_history(uri, summary["mlflow_run_id"], "train/rollout_is_weight_mean")]
        assert len(tis) == 2 and all(0.0 < w <= 2.0 for w in tis), tis
    if algorithm == "dpo":
        assert summary["margin_before"] is not None and summary["margin_after"] is not None
        assert [s for s, _ in read_metric_history(uri, summary["mlflow_run_id"], "eval/preference_margin")] == [0, 2]
        assert any(".mlp.experts." in k for k in after), "not the MoE model"
    if algorithm == "pf_ppo":
        check_data_parallel_run(cfg, summary, rank_weights, uri)
    if algorithm == "gspo":
        check_reward_model(summary, uri)
    if algorithm == "ppo":
        check_megatron_run(cfg, summary, rank_weights, critics, before)


def test_partial_rollout_parks_and_resumes_groups_across_two_generators(ray_cluster, tiny_config):
    """Partial rollout through Ray on the cost-model engine (its rollouts end at modelled lengths; the tiny SFT
    model here rarely emits EOS): two generators share the queue actor, with the prompt sampler as look-ahead.
    Iteration 1 over-provisions; every iteration starts G new prompts (more while its window is short), parks
    groups and finishes parked ones. Every window gets G x N samples within the staleness bound."""
    cost = {"engine__backend": "cost_model", "engine__cost_model__decode_s_per_step": 0.001, "sft__enabled": False,
            "engine__cost_model__prefill_s_per_token": 0.0,  # the generators have 0 CPUs here
            "engine__cost_model__length_mu": 1.5, "engine__cost_model__length_sigma": 0.8, "rollout__max_new_tokens": 8}
    cfg = tiny_config("partial", 3, **cost, placement__mode="disaggregated", placement__generators=2,
                      placement__generator_cpus=0, train__max_staleness=1, rollout__partial__token_budget=2,
                      dock__backend="centralized", eval__every=0, checkpoint__every=0)
    history: list[dict] = []
    train(cfg, on_iteration=lambda step, metrics: history.append(metrics))

    g, n = cfg.rollout.prompts_per_iter, cfg.rollout.group_size
    assert [h["rollout/samples"] for h in history] == [g * n] * 3
    new = [h["flow/new_groups"] for h in history]
    assert g < new[0] <= 2 * g and all(g <= k <= 2 * g for k in new), new  # G each, + over-provisioning when short
    assert all(h["flow/parked_groups"] > 0 for h in history) and sum(h["flow/resumed_groups"] for h in history[1:]) > 0
    assert max(h["staleness/max"] for h in history) <= 2  # max_staleness + max_age
    assert history[-1]["flow/dropped_parked_groups_total"] == 0


def test_a_run_resumed_with_generations_in_flight_repeats_and_loses_no_sample(ray_cluster, tiny_config):
    """max_staleness 1 with partial rollout: the checkpoint at iteration 2 holds iteration 3's samples (generated
    ahead, in the dock) and the parked groups; resumed from it, the run ends bit-identical to the uninterrupted
    one, so no sample was lost or generated twice."""
    cfg = tiny_config("inflight", 4, placement__mode="disaggregated", placement__generator_cpus=0,
                      train__max_staleness=1, rollout__partial__token_budget=4, checkpoint__keep=3, eval__every=0,
                      dock__backend="centralized")
    full = train(cfg)
    final = load_file(str(Path(full["final_model"]) / "model.safetensors"))
    store = run_store(cfg.checkpoint, cfg.run)
    inflight = store.read_part(2, "inflight", types=checkpoint_types())
    assert list(inflight["windows"]) == [2] and len(inflight["windows"][2]["indices"]) == cfg.global_batch
    assert inflight["queue"]["parked"], "nothing was parked: partial rollout did not run"
    store.delete(4)
    saved = read_record(store, 2)
    assert list(saved.inflight) == [2] and [(s, sc["eval/test_accuracy"]) for s, sc in saved.evals] == [
        (0, full["accuracy_before"])]
    resumed = train(cfg, resume=True)
    assert resumed["resumed_from"] == 2 and resumed["samples_trained"] == 4 * build_plan(cfg).train_batch
    same = ("accuracy_before", "accuracy_after", "evals", "reward_per_iteration", "iterations", "restarts",
            "mlflow_run_id", "sft/val_accuracy")
    assert {k: resumed[k] for k in same} == {k: full[k] for k in same}
    assert read_record(store, 4).evaluated_steps == {0, 4}  # the new checkpoint: every evaluation
    after = load_file(str(Path(resumed["final_model"]) / "model.safetensors"))
    assert all(torch.equal(final[k], after[k]) for k in final), "the resumed run's policy differs"


def check_megatron_run(cfg, summary, rank_weights, critics, initial: dict[str, torch.Tensor]) -> None:
    """Iteration 1 ran on two TP ranks of the policy and two of the critic; its checkpoint holds each rank's shards,
    the actor's and the critic's, as dist_checkpointing parts, no gathered state. Iteration 2 resumed from it at
    ``train.tp=1 train.dp=2``: two megatron replicas of the whole policy (each takes its half of every batch from
    the dock, their grads summed) and one critic rank. Both layouts' ranks hold one policy after each iteration, the
    final model is it, and the optimizers' steps went on from the checkpoint's (its AdamW state loaded at DP=2)."""
    name = cfg.run.name
    assert critics == [[f"{name}-critic", f"{name}-critic-1"], [f"{name}-critic"]], critics
    assert len(rank_weights) == 2 and all(len(ranks) == 2 for ranks in rank_weights)
    for first, second in rank_weights:
        assert all(torch.equal(first[k], second[k]) for k in first), "the ranks hold different policies"
    final = load_file(str(Path(summary["final_model"]) / "model.safetensors"))
    assert all(torch.equal(final[k], rank_weights[-1][0][k]) for k in rank_weights[-1][0])
    store = run_store(cfg.checkpoint, cfg.run)
    for part in ("actor", "critic"):
        assert store.read_part(1, part)["engine"] == {"dist_checkpoint": f"{part}.mcore"}
        assert sum(p.startswith(f"{part}.mcore.") and p.endswith(".distcp") for p in store.list_parts(1)) == 2
        steps = [dist_checkpoint_common(store, step, f"{part}.mcore")["optimizer"]["step"] for step in (1, 2)]
        assert steps[0] > 0 and steps[1] == 2 * steps[0], (part, steps)
    critic = dist_checkpoint_tensors(store, 2, "critic.mcore", ("output_layer.head.", "decoder.final_layernorm."))
    assert critic["output_layer.head.weight"].abs().sum() > 0, "the critic's value head did not train"
    assert not torch.equal(critic["decoder.final_layernorm.weight"], initial["model.norm.weight"]), \
        "the critic's trunk did not train"
    uri = resolve_tracking_uri(cfg.tracking.uri, cfg.run.output_dir)
    for key in ("train/dp_load_imbalance", "memory/rank1/update/grads_bytes"):  # the DP ranks' update, iteration 2
        assert [s for s, _ in read_metric_history(uri, summary["mlflow_run_id"], key)] == [1, 2], key


def check_reward_model(summary, uri) -> None:
    """The reward-model worker scored each iteration's rollouts, and the combined reward is the verifier's plus
    half the model's score (GSPO does not shape rewards: the combined mean is the weighted sum of the means)."""

    def history(key: str) -> list[float]:
        steps = read_metric_history(uri, summary["mlflow_run_id"], key)
        assert [s for s, _ in steps] == [1, 2], key
        return [v for _, v in steps]

    assert all(t > 0 for t in history("timing/reward_model_s"))
    rm, verifier, combined = history("rewards/tiny-rm/mean"), history("rewards/math_verify/mean"), history("reward/mean")
    assert all(math.isfinite(v) and v != 0.0 for v in rm)
    assert rm[0] != rm[1]  # new rollouts, new scores
    for step in range(2):
        assert combined[step] == pytest.approx(verifier[step] + 0.5 * rm[step], abs=1e-5)


def critic_workers(cfg) -> list[str]:
    """The names of the run's critic workers that Ray holds now (sorted)."""
    import ray

    prefix = f"{cfg.run.name}-critic"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"] == prefix or a["name"].startswith(f"{prefix}-"))


def dist_checkpoint_tensors(store, step: int, index: str, prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The whole tensors whose keys start with ``prefixes`` in the dist_checkpointing checkpoint ``index`` of
    ``step`` (its files rebuilt from the store's parts), read in this process by torch.distributed.checkpoint."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in store.read_part(step, index)["files"]:
            (Path(tmp) / name).write_bytes(store.read_part(step, f"{index}.{name}").numpy().tobytes())
        reader = dcp.FileSystemReader(tmp)
        meta = reader.read_metadata().state_dict_metadata
        state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items() if k.startswith(prefixes)}
        dcp.load(state, storage_reader=reader, no_dist=True)
    return state


def dist_checkpoint_common(store, step: int, index: str) -> dict:
    """The common (non-tensor) state of the dist_checkpointing checkpoint ``index`` of ``step``."""
    return torch.load(io.BytesIO(store.read_part(step, f"{index}.common.pt").numpy().tobytes()), weights_only=False)


def policy_of_each_rank(cfg) -> list[dict]:
    """After an iteration (the ranks are in their generation state): each actor rank's full policy weights."""
    import ray

    names = [f"{cfg.run.name}-actor"] + [f"{cfg.run.name}-actor-{k}" for k in range(1, cfg.train.actor_ranks)]
    return [p[1]["weights"] for p in ray.get([ray.get_actor(n).publish_weights.remote() for n in names])]


def check_data_parallel_run(cfg, summary, rank_weights, uri) -> None:
    """DP=2: the ranks hold one policy, the final model is that policy, and the ledger reached MLflow with no
    update state on the device during generation. (The unsharded checkpoint's round trip is unit-tested in
    tests/unit/engines/test_fsdp_training.py; resuming a run through a checkpoint in test_train_loop.)"""
    assert len(rank_weights) == 2 and all(len(ranks) == 2 for ranks in rank_weights)
    for first, second in rank_weights:
        assert first.keys() == second.keys()
        assert all(torch.equal(first[k], second[k]) for k in first), "the DP ranks hold different policies"
    final = load_file(str(Path(summary["final_model"]) / "model.safetensors"))
    assert all(torch.equal(final[k], rank_weights[-1][0][k]) for k in rank_weights[-1][0])
    # the ranks took length-balanced shares from the dock (dp_share): the busiest computed < 1.5x the mean
    imbalance = read_metric_history(uri, summary["mlflow_run_id"], "train/dp_load_imbalance")
    assert [s for s, _ in imbalance] == [1, 2] and all(1.0 <= v < 1.5 for _, v in imbalance), imbalance
    for rank in range(2):
        for phase, category in [("generation", "update_weights"), ("generation", "grads"), ("generation", "optimizer_state")]:
            history = read_metric_history(uri, summary["mlflow_run_id"], f"memory/rank{rank}/{phase}/{category}_bytes")
            assert [v for _, v in history] == [0.0, 0.0], (rank, phase, category)
        for key in ("update/optimizer_state_bytes", "generation/generation_weights_bytes", "reshard/temp_buffer_bytes"):
            history = read_metric_history(uri, summary["mlflow_run_id"], f"memory/rank{rank}/{key}")
            assert [s for s, _ in history] == [1, 2] and all(v > 0 for _, v in history), (rank, key)
