"""Qwen3-MoE as a megatron-core ``GPTModel`` on two gloo ranks at EP=2 (each rank 2 of the 4 experts, and a DP share
of the batch of its own width, so the all-to-all dispatcher moves unequal token counts), against
``TorchTrainingEngine`` on the same weights: the response log-probs agree within 1e-5, and so do the gradients of the
GRPO loss (dense grads summed over DP, expert grads over the expert-DP group, gathered and HF-named) within float32
rounding (``fixtures/tolerances.py``); the gathered weights convert back to the HF ones exactly. Then
``MegatronTrainingEngine`` at EP=2 (each rank its DP share): its log-probs equal the torch engine's within 1e-5, its
gradients (AdamW's first moments, gathered HF-named) within float32 rounding, and its weights after one GRPO update
(clipping that bites, AdamW with weight decay; read from the generation copy, resharded by allgather-swap from the
EP shards) within what that rounding can change in one AdamW step (``fixtures/tolerances.py``, as
test_megatron_engine.py): a flat 1e-5 does not hold where a gradient is near 0, since AdamW's first step moves a
weight by ``lr * g / (|g| + eps)`` whatever ``g``'s size. Measured: 1.4e-5 on 2 elements of layer 1's router row
for an expert no token picked, whose gradient is exactly 0 in megatron (softmax over the top-k logits) and 1e-10 of
rounding in the torch engine (softmax over every expert, then top-k, renormalised); every other weight within 1.8e-6.
The generation copy, resharded by allgather-swap from the EP=2 shards (each rank 2 of the 4 experts), holds every
expert equal to the trainer's gathered weights, with 0 redundant bytes and no update state on the device.
The layout-free ``state_dict`` and the run checkpoint (``save_state``, ``dist_checkpointing``) resume the next step
bit-exactly at EP=2, and the checkpoint loads at EP=1 with every weight, AdamW moment and the step as saved.

megatron is imported once, in the fork server the ranks start from (``tests/fixtures/ranks.py``).
"""

from __future__ import annotations

import functools
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from fixtures.engine_batches import grpo_loss, rollout_batch, with_old_log_probs
from fixtures.ranks import start_ranks
from fixtures.tiny_models import tiny_moe
from fixtures.tolerances import assert_first_step_close, assert_grads_close, first_step_grads, grad_tolerance

from dockflow.engines.megatron.convert import hf_to_megatron, megatron_to_hf, spec_from_hf
from dockflow.engines.torch_training import TorchTrainingEngine
from dockflow.reshard import UPDATE_STATE, measured_redundant_bytes
from dockflow.storage import LocalCheckpointStore

pytestmark = pytest.mark.kernels  # cross-engine tolerances: run under the other ATen kernel set too (Makefile)

TEMPERATURE = 0.7
ENGINE_ARGS = dict(lr=1e-3, weight_decay=0.1, grad_clip=0.5, temperature=TEMPERATURE)
SHARES = ([0, 2], [1, 3])  # rank 0 keeps 2 left-padding columns (9 tokens a row), rank 1 none (11)


@functools.cache
def _batch():
    """The rollouts with old / reference log-probs from the torch engine (the same on every rank)."""
    batch = rollout_batch()
    return with_old_log_probs(batch, TorchTrainingEngine(tiny_moe(), lr=1e-3, temperature=TEMPERATURE).infer(batch))


def _resumes(engine, state: dict, batch, tmp: Path, rank: int) -> tuple[list[bool], LocalCheckpointStore, dict]:
    """Save the engine (``save_state``: each rank's shards, its experts among them, through ``dist_checkpointing``),
    take a second step, then from the layout-free ``state`` and from the checkpoint: is that step the same?"""
    store = LocalCheckpointStore(tmp / "ckpt", keep=2)
    saved = engine.save_state(store, 1, "actor")
    if rank == 0:
        store.commit(1, {"iteration": 1})
    dist.barrier()
    engine.train_mini_batch(batch, grpo_loss(), micro_batch_size=1)
    second = {n: w.clone() for n, w in engine.named_weights()}
    equal = []
    for load in (lambda: engine.load_state_dict(state), lambda: engine.load_state(store, 1, "actor", saved)):
        load()
        engine.train_mini_batch(batch, grpo_loss(), micro_batch_size=1)
        equal.append(all(torch.equal(w, second[n]) for n, w in engine.named_weights()))
    return equal, store, saved


def _at_ep1(store: LocalCheckpointStore, saved: dict, state: dict) -> bool:
    """The EP=2 checkpoint loaded at EP=1 (each rank every expert): the same weights, AdamW moments and step."""
    from dockflow.engines.megatron import model as mg
    from dockflow.engines.megatron.training import MegatronTrainingEngine

    mg.destroy_model_parallel()
    engine = MegatronTrainingEngine(tiny_moe(), ep=1, **ENGINE_ARGS)
    engine.load_state(store, 1, "actor", saved)
    loaded = engine.state_dict()
    same = [torch.equal(loaded["model"][n], t) for n, t in state["model"].items()]
    same += [torch.equal(loaded["optimizer"][k][n], t) for k in ("exp_avg", "exp_avg_sq")
             for n, t in state["optimizer"][k].items()]
    return all(same) and loaded["optimizer"]["step"] == state["optimizer"]["step"] and len(same) > 0


def _rank(rank: int, tmp: str) -> None:
    from megatron.core import parallel_state

    from dockflow.engines.megatron import model as mg
    from dockflow.engines.megatron.schedule import pipeline_forward_backward, pipeline_response_log_probs
    from dockflow.engines.megatron.training import MegatronTrainingEngine

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(str(Path(tmp) / "store"), 2), rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    applied = mg.init_model_parallel(tp=1, pp=1, seed=0, device="cpu", ep=2)
    hf = tiny_moe()
    spec = spec_from_hf(hf.config)
    model = mg.build_gpt_model(spec, ep=2)
    mg.load_full_state(model, hf_to_megatron(hf.state_dict(), spec), spec)
    batch = _batch()[SHARES[parallel_state.get_data_parallel_rank()]]
    ids, mask, width = batch["input_ids"], batch["attention_mask"], batch["responses"].shape[1]
    model.eval()
    logp = pipeline_response_log_probs(model, ids, mask, width, spec.vocab_size, micro_batch_size=1,
                                       temperature=TEMPERATURE)
    model.train()
    tokens = float(_batch()["response_mask"].sum())
    loss = grpo_loss()
    pipeline_forward_backward(model, ids, mask, width, spec.vocab_size, micro_batch_size=1, temperature=TEMPERATURE,
                              loss_fn=lambda out, rows: loss(out.values, batch[rows], tokens)[0])
    for name, param in model.named_parameters():  # what the engine's DP / expert-DP reduction does
        expert = ".experts." in name
        group = parallel_state.get_expert_data_parallel_group() if expert else parallel_state.get_data_parallel_group()
        dist.all_reduce(param.grad, group=group)
    grads = mg.gather_full({n: p.grad for n, p in model.named_parameters()}, spec)
    local = sorted(n for n, _ in model.named_parameters() if "layers.0.mlp" in n)
    out = {"applied": applied, "logp": logp, "grads": megatron_to_hf(grads, spec), "local": local,
           "weights": megatron_to_hf(mg.gather_full_state(model, spec), spec)}
    engine = MegatronTrainingEngine(tiny_moe(), ep=2, **ENGINE_ARGS)
    out["engine_logp"] = engine.infer(batch)
    out["metrics"] = engine.train_mini_batch(batch, grpo_loss(), micro_batch_size=1)
    out["engine_weights"] = {n: w.clone() for n, w in engine.named_weights()}
    out["redundant_bytes"] = measured_redundant_bytes(engine._local_weights.values(),
                                                      engine.policy_module().parameters(), "cpu")
    out["memory"] = engine.memory_metrics()
    state = engine.state_dict()
    out["trainer"] = state["model"]  # gathered from the EP shards (``model.gather_full``), not resharded
    out["exp_avg"] = state["optimizer"]["exp_avg"]
    out["resumed_equal"], store, saved = _resumes(engine, state, batch, Path(tmp), rank)
    out["ep1_equal"] = _at_ep1(store, saved, state)
    torch.save(out, Path(tmp) / f"rank{rank}.pt")
    dist.barrier()
    mg.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("megatron_moe")
    start_ranks(_rank, (str(tmp),), 2)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def reference() -> dict:
    """The torch engine on one process: log-probs, and the first step's gradients (no clipping) from AdamW's moments."""
    engine = TorchTrainingEngine(tiny_moe(), lr=1e-3, grad_clip=1e9, temperature=TEMPERATURE)
    batch = _batch()
    logp = engine.infer(batch)
    engine.train_mini_batch(batch, grpo_loss(), micro_batch_size=4)
    exp_avg = {n: engine.optimizer.state[p]["exp_avg"] for n, p in engine.model.named_parameters()}
    out = {"logp": logp, "grads": first_step_grads(exp_avg), "mask": batch["response_mask"]}
    engine = TorchTrainingEngine(tiny_moe(), **ENGINE_ARGS)  # the update the megatron engine takes
    out["metrics"] = engine.train_mini_batch(batch, grpo_loss(), micro_batch_size=2)
    out["weights"] = {n: w.clone() for n, w in engine.named_weights()}
    out["clipped"] = first_step_grads({n: engine.optimizer.state[p]["exp_avg"] for n, p in engine.model.named_parameters()})
    return out


def test_moe_log_probs_and_grpo_gradients_at_ep2_equal_the_torch_engine(ranks, reference):
    assert "megatron.core.transformer.moe.token_dispatcher.maybe_move_tensor_to_cpu" in ranks[0]["applied"]
    mask = reference["mask"]
    for rank, out in enumerate(ranks):
        rows = SHARES[rank]
        torch.testing.assert_close(out["logp"] * mask[rows], reference["logp"][rows] * mask[rows], rtol=0, atol=1e-5)
        assert set(out["grads"]) - set(reference["grads"]) == {"lm_head.weight"}  # tied: the embedding itself
        assert_grads_close(out["grads"], reference["grads"])
        experts = [n for n in out["local"] if ".experts." in n]  # 2 of the 4 experts, numbered from 0 on each rank
        assert experts == [f"decoder.layers.0.mlp.experts.local_experts.{j}.linear_fc{k}.weight"
                           for j in range(2) for k in (1, 2)]
        for name, weight in tiny_moe().state_dict().items():
            assert torch.equal(out["weights"][name], weight), name
    assert all(float(g.abs().max()) > 0 for g in reference["grads"].values())  # every weight has a gradient


def test_one_grpo_update_at_ep2_leaves_the_torch_engines_weights(ranks, reference):
    mask, grads = reference["mask"], reference["clipped"]
    assert reference["metrics"]["grad_norm"] > ENGINE_ARGS["grad_clip"]  # the clipping bites
    before = tiny_moe().state_dict()
    for rank, out in enumerate(ranks):
        rows = SHARES[rank]
        torch.testing.assert_close(out["engine_logp"] * mask[rows], reference["logp"][rows] * mask[rows],
                                   rtol=0, atol=1e-5)
        for key in ("grad_norm", "train/pg_loss", "train/loss"):
            assert out["metrics"][key] == pytest.approx(reference["metrics"][key], rel=1e-5, abs=1e-6), key
        assert_grads_close(first_step_grads(out["exp_avg"]), grads)
        assert out["engine_weights"].keys() == reference["weights"].keys()
        for key, weight in reference["weights"].items():
            assert_first_step_close(out["engine_weights"][key], weight, grads[key], grad_tolerance(grads),
                                    ENGINE_ARGS["lr"], key)
            assert not torch.equal(weight, before[key]), key  # every weight moved
        assert out["resumed_equal"] == [True, True]  # from the state dict, and from the run checkpoint
        assert out["ep1_equal"]  # the EP=2 checkpoint loads at EP=1


def test_allgather_swap_from_ep2_shards_gives_generation_every_expert_and_nothing_redundant(ranks):
    """After the update each rank holds 2 of the 4 experts (and the dense weights, vocabulary padded to 128 rows);
    the generation copy, resharded by allgather-swap, holds every expert, equal to the trainer's gathered weights,
    with the update state on the host."""
    hf = tiny_moe()
    nbytes = {n: w.numel() * w.element_size() for n, w in hf.named_parameters()}
    experts = sum(b for n, b in nbytes.items() if ".experts." in n)
    padding = (128 - hf.config.vocab_size) * hf.config.hidden_size * 4  # one tied embedding, padded
    for rank, out in enumerate(ranks):
        assert set(out["trainer"]) - set(out["engine_weights"]) <= {"lm_head.weight"}  # tied: the embedding
        assert sum(".experts." in n for n in out["engine_weights"]) == sum(".experts." in n for n in nbytes)
        for key, weight in out["engine_weights"].items():
            assert torch.equal(weight, out["trainer"][key]), (rank, key)
        assert out["redundant_bytes"] == 0, rank
        memory = {k.removeprefix(f"memory/rank{rank}/"): v for k, v in out["memory"].items()}
        for category in UPDATE_STATE:
            assert memory[f"generation/{category}_bytes"] == 0, (rank, category)
        assert memory["generation/generation_weights_bytes"] == sum(nbytes.values()), rank
        assert memory["update/update_weights_bytes"] == sum(nbytes.values()) - experts // 2 + padding, rank


@pytest.mark.parametrize(("model", "args", "message"), [
    ("moe", dict(ep=3), r"^train.ep=3 must divide the model's experts \(4\)"),
    ("dense", dict(ep=2), r"^train.ep=2 splits a mixture of experts, but the model \(qwen3\) has a dense MLP"),
    ("moe", dict(tp=2), r"^train.tp=2 with a mixture of experts: megatron-core trains MoE at TP > 1 only with sequence"),
    ("moe", dict(pp=2), r"^train.pp=2 with a mixture of experts: the reshard"),
    ("moe", dict(ep=2, max_tokens_per_micro_batch=64), r"^train.max_tokens_per_micro_batch with train.ep=2"),
])
def test_settings_that_cannot_run_end_in_one_line_before_any_rank_starts(model, args, message):
    from fixtures.tiny_models import tiny_decoder

    from dockflow.engines.megatron.training import MegatronTrainingEngine

    with pytest.raises(ValueError, match=message):  # raised before torch.distributed is needed
        MegatronTrainingEngine(tiny_moe() if model == "moe" else tiny_decoder("qwen3"), lr=1e-3, **args)
