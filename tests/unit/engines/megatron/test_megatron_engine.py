"""``MegatronTrainingEngine`` on gloo ranks at TP=2 and at PP=2 (two ranks each), built from an HF directory,
against ``TorchTrainingEngine`` (DP=1) on the same weights: log-probs before and after one GRPO update (the
recipe's loss, 2 micro-batches, clipping that bites, AdamW with weight decay) agree within 1e-5, the gradients
(AdamW's first moments in the layout-free ``state_dict``) within float32 rounding, and the updated weights (gathered,
HF-named) within what that rounding can change in one AdamW step (``fixtures/tolerances.py`` derives both, so
another CPU's kernels pass too); so do the grad norm, the loss metrics and AdamW's second moments; the generation copy, resharded by allgather-swap, equals the trainer's gathered weights exactly
with the update state on the host (0 redundant bytes in the ledger); a reloaded ``state_dict`` resumes bit-exactly, and
so does the run checkpoint ``save_state`` writes (each rank's shards through ``dist_checkpointing`` into a local
checkpoint store) loaded by ``load_state``; ``save_pretrained`` writes the updated HF model. With
``gradient_checkpointing`` (megatron's full recompute, each layer's forward run again in the backward) the log-probs
and the first step are the same.

megatron is imported once, in the fork server the ranks start from (``tests/fixtures/ranks.py``).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from fixtures.engine_batches import grpo_loss, rollout_batch, with_old_log_probs
from fixtures.ranks import start_ranks
from fixtures.tiny_models import tiny_decoder
from fixtures.tolerances import assert_first_step_close, assert_grads_close, first_step_grads, grad_tolerance

from dockflow.engines.torch_training import TorchTrainingEngine
from dockflow.reshard import UPDATE_STATE, measured_redundant_bytes
from dockflow.storage import LocalCheckpointStore

pytestmark = pytest.mark.kernels  # cross-engine tolerances: run under the other ATen kernel set too (Makefile)

NAMES = ("qwen2_tied", "qwen3")  # tied embedding (a last-stage copy at PP=2); q/k norms reduced over TP
DP_MODEL = "qwen3"  # at TP=2 x DP=2: its q/k norm grads are summed over TP, then every grad over DP
ENGINE_ARGS = dict(lr=1e-3, weight_decay=0.1, grad_clip=0.5, infer_batch_size=3, temperature=0.7)
METRICS = ("grad_norm", "train/pg_loss", "train/kl", "train/clip_fraction", "train/loss", "train/entropy")
RECOMPUTE_MODEL = "qwen3"


def _weights(engine) -> dict[str, torch.Tensor]:
    return {n: w.clone() for n, w in engine.named_weights()}


def _recompute_step(engine) -> dict:
    """One update with full activation recompute; counts the layer units megatron checkpointed."""
    from megatron.core import tensor_parallel

    checkpoint, calls = tensor_parallel.checkpoint, []
    tensor_parallel.checkpoint = lambda *args: calls.append(1) or checkpoint(*args)  # this rank's process only
    batch = rollout_batch()
    out = {"logp": engine.infer(batch)}
    out["metrics"] = engine.train_mini_batch(with_old_log_probs(batch, out["logp"]), grpo_loss(), micro_batch_size=2)
    tensor_parallel.checkpoint = checkpoint
    out["weights"], out["checkpointed"], out["pp"] = _weights(engine), len(calls), engine.pp
    out["exp_avg"] = engine.state_dict()["optimizer"]["exp_avg"]
    return out


def _rank(rank: int, layout: tuple[int, int], tmp: str) -> None:
    from dockflow.engines.megatron import model as mg
    from dockflow.engines.megatron.training import MegatronTrainingEngine

    tp, pp = layout
    torch.set_num_threads(1)
    store = dist.FileStore(str(Path(tmp) / "store"), tp * pp)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=tp * pp, timeout=timedelta(seconds=60))
    result = {}
    for name in NAMES:
        engine = MegatronTrainingEngine.from_pretrained(Path(tmp) / name, tp=tp, pp=pp, **ENGINE_ARGS)
        batch = rollout_batch()
        out = {"logp": engine.infer(batch)}
        batch = with_old_log_probs(batch, out["logp"])
        out["metrics"] = engine.train_mini_batch(batch, grpo_loss(), micro_batch_size=2)
        out["weights"] = _weights(engine)
        out["redundant_bytes"] = measured_redundant_bytes(
            engine._local_weights.values(), engine.policy_module().parameters(), "cpu")
        out["memory"] = engine.memory_metrics()
        out["logp_after"] = engine.infer(batch)
        state = engine.state_dict()
        out["state"] = state
        store = LocalCheckpointStore(Path(tmp) / f"ckpt_{name}", keep=2)
        saved = engine.save_state(store, 1, "actor")  # each rank's shards through dist_checkpointing
        parts = sorted(store.commit(1, {"iteration": 1}).parts) if rank == 0 else None
        engine.train_mini_batch(batch, grpo_loss(), micro_batch_size=2)
        second = _weights(engine)
        for source in ("state_dict", "store"):
            if source == "state_dict":
                engine.load_state_dict(state)
            else:
                engine.load_state(store, 1, "actor", saved)
            out.setdefault("reloaded", []).append({n: p.detach().clone()
                                                   for n, p in engine.policy_module().named_parameters()})
            engine.train_mini_batch(batch, grpo_loss(), micro_batch_size=2)
            out.setdefault("resumed_equal", []).append(all(torch.equal(w, second[n]) for n, w in engine.named_weights()))
        out["saved"], out["parts"] = saved, parts
        engine.load_state_dict(state)
        engine.save_pretrained(Path(tmp) / f"{name}_saved")
        result[name] = out
    engine = MegatronTrainingEngine.from_pretrained(Path(tmp) / RECOMPUTE_MODEL, tp=tp, pp=pp, **ENGINE_ARGS,
                                                    gradient_checkpointing=True)
    result["recompute"] = _recompute_step(engine)
    # token budgets: rows of 9, 9, 3 and 11 tokens in 20 are micro-batches of 2, 1 and 1 rows, a pass each
    engine = MegatronTrainingEngine.from_pretrained(Path(tmp) / RECOMPUTE_MODEL, tp=tp, pp=pp, **ENGINE_ARGS,
                                                    max_tokens_per_micro_batch=20)
    result["budget"] = _recompute_step(engine)
    torch.save(result, Path(tmp) / f"rank{rank}.pt")
    dist.barrier()
    mg.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=[(2, 1), (1, 2)], ids=["tp2", "pp2"])
def ranks(request, tmp_path_factory) -> tuple[list[dict], Path]:
    tmp = tmp_path_factory.mktemp("megatron_engine")
    for name in NAMES:
        tiny_decoder(name).save_pretrained(tmp / name)
    start_ranks(_rank, (request.param, str(tmp)), 2)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(2)], tmp


@pytest.fixture(scope="module")
def reference() -> dict[str, dict]:
    """The torch engine on one process: the same batch, loss and settings."""
    out = {}
    for name in NAMES:
        engine = TorchTrainingEngine(tiny_decoder(name), **ENGINE_ARGS)
        batch = rollout_batch()
        logp = engine.infer(batch)
        batch = with_old_log_probs(batch, logp)
        metrics = engine.train_mini_batch(batch, grpo_loss(), micro_batch_size=2)
        opt = engine.optimizer
        moments = {key: {n: opt.state[p][key] for n, p in engine.model.named_parameters()}
                   for key in ("exp_avg", "exp_avg_sq")}
        out[name] = {"logp": logp, "metrics": metrics, "weights": _weights(engine),
                     "logp_after": engine.infer(batch), "moments": moments, "mask": batch["response_mask"]}
    return out


def _close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Log-probs and moments: a forward pass's float32 rounding is far below 1e-5 on these tiny models."""
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5, msg=what)


def _same_step(weights: dict[str, torch.Tensor], exp_avg: dict[str, torch.Tensor], ref: dict) -> None:
    """The gradients (from AdamW's first moments) agree to rounding, and so does the step each one determines."""
    grads = first_step_grads(ref["moments"]["exp_avg"])
    assert_grads_close(first_step_grads(exp_avg), grads)
    for key, weight in ref["weights"].items():
        assert_first_step_close(weights[key], weight, grads[key], grad_tolerance(grads), ENGINE_ARGS["lr"], key)


@pytest.mark.parametrize("name", NAMES)
def test_log_probs_and_one_grpo_update_equal_the_torch_engine(ranks, reference, name):
    ref = reference[name]
    mask = ref["mask"]
    for r in ranks[0]:
        out = r[name]
        _close(out["logp"] * mask, ref["logp"] * mask, "log-probs")
        _close(out["logp_after"] * mask, ref["logp_after"] * mask, "log-probs after the update")
        assert ref["metrics"]["grad_norm"] > ENGINE_ARGS["grad_clip"]  # the clipping bites
        for key in METRICS:
            assert out["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-6), key
        assert out["weights"].keys() == ref["weights"].keys()
        _same_step(out["weights"], out["state"]["optimizer"]["exp_avg"], ref)
        before = tiny_decoder(name).state_dict()
        for key, weight in ref["weights"].items():
            assert not torch.equal(weight, before[key]), key  # every weight moved


def test_full_activation_recompute_takes_the_same_first_step(ranks, reference):
    ref = reference[RECOMPUTE_MODEL]
    for r in ranks[0]:
        out = r["recompute"]
        assert out["checkpointed"] == 2 * 2 // out["pp"]  # 2 micro-batches x the stage's layers (of 2)
        _close(out["logp"] * ref["mask"], ref["logp"] * ref["mask"], "log-probs")
        for key in METRICS:
            assert out["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-6), key
        _same_step(out["weights"], out["exp_avg"], ref)


def test_token_budget_micro_batches_take_the_same_first_step(ranks, reference):
    ref = reference[RECOMPUTE_MODEL]
    for r in ranks[0]:
        out = r["budget"]
        assert out["checkpointed"] == 0  # no recompute here
        for key in METRICS:
            assert out["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-6), key
        _same_step(out["weights"], out["exp_avg"], ref)


@pytest.mark.parametrize("name", NAMES)
def test_allgather_swap_gives_generation_the_trainers_weights_and_nothing_redundant(ranks, name):
    full_bytes = sum(w.numel() * w.element_size() for w in tiny_decoder(name).parameters())
    for rank, r in enumerate(ranks[0]):
        out = r[name]
        trainer = out["state"]["model"]  # gathered from the shards (``model.gather_full``), not resharded
        assert set(trainer) - set(out["weights"]) <= {"lm_head.weight"}  # a tied lm_head is the embedding
        for key, weight in out["weights"].items():
            assert torch.equal(weight, trainer[key]), (rank, key)
        assert out["redundant_bytes"] == 0, rank
        memory = {k.removeprefix(f"memory/rank{rank}/"): v for k, v in out["memory"].items()}
        for category in UPDATE_STATE:
            assert memory[f"generation/{category}_bytes"] == 0, (rank, category)
            assert memory[f"update/{category}_bytes"] > 0, (rank, category)
        assert memory["generation/generation_weights_bytes"] == full_bytes, rank


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_is_full_and_resumes_bit_exact(ranks, reference, name):
    ref = reference[name]
    for r in ranks[0]:
        out = r[name]
        for param, moment in ref["moments"]["exp_avg_sq"].items():  # exp_avg: the gradients, in _same_step
            _close(out["state"]["optimizer"]["exp_avg_sq"][param], moment, f"exp_avg_sq {param}")
        assert out["state"]["optimizer"]["step"] == 1.0
        for reloaded in out["reloaded"]:  # the generation copy holds the loaded weights at once
            for key, weight in out["weights"].items():
                assert torch.equal(reloaded[key], weight), key
        assert out["resumed_equal"] == [True, True]  # from state_dict, and from the store's dist checkpoint
        assert out["saved"] == {"dist_checkpoint": "actor.mcore"}
    parts = ranks[0][0][name]["parts"]
    assert "actor.mcore" in parts and sum(p.startswith("actor.mcore.") and p.endswith(".distcp") for p in parts) == 2


def _dp_rank(rank: int, tmp: str) -> None:
    """TP=2 x DP=2: replica ``rank // 2`` (megatron's order: TP fastest) trains on its half of the batch."""
    from dockflow.engines.megatron import model as mg
    from dockflow.engines.megatron.training import MegatronTrainingEngine

    torch.set_num_threads(1)
    store = dist.FileStore(str(Path(tmp) / "dp_store"), 4)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=4, timeout=timedelta(seconds=60))
    engine = MegatronTrainingEngine.from_pretrained(Path(tmp) / DP_MODEL, tp=2, **ENGINE_ARGS)
    batch = rollout_batch()
    out = {"logp": engine.infer(batch)}
    batch = with_old_log_probs(batch, out["logp"])
    replica = rank // 2  # rows 0-1 (8 response tokens) or rows 2-3 (6): the loss is over the global tokens
    out["metrics"] = engine.train_mini_batch(batch[2 * replica : 2 * replica + 2], grpo_loss(), micro_batch_size=1)
    out["weights"] = _weights(engine)  # allgather-swapped from the TP x DP update layout
    state = engine.state_dict()
    out["trainer"] = state["model"]  # gathered from the shards, not resharded
    out["exp_avg"] = state["optimizer"]["exp_avg"]
    out["redundant_bytes"] = measured_redundant_bytes(
        engine._local_weights.values(), engine.policy_module().parameters(), "cpu")
    out["logp_after"] = engine.infer(batch)
    torch.save(out, Path(tmp) / f"dp_rank{rank}.pt")
    dist.barrier()
    mg.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def dp_ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("megatron_dp")
    tiny_decoder(DP_MODEL).save_pretrained(tmp / DP_MODEL)
    start_ranks(_dp_rank, (str(tmp),), 4)
    return [torch.load(tmp / f"dp_rank{r}.pt", weights_only=False) for r in range(4)]


def test_one_grpo_update_at_tp2_x_dp2_on_half_batches_equals_the_torch_engine_on_the_whole(dp_ranks, reference):
    """Each DP replica's grads from its half, summed over megatron's DP group with the loss normalised by the global
    tokens, give the whole batch's step; the metrics are the whole batch's too."""
    ref = reference[DP_MODEL]
    mask = ref["mask"]
    before = tiny_decoder(DP_MODEL).state_dict()
    for rank, out in enumerate(dp_ranks):
        _close(out["logp"] * mask, ref["logp"] * mask, "log-probs")
        _close(out["logp_after"] * mask, ref["logp_after"] * mask, "log-probs after the update")
        for key in METRICS:
            assert out["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-6), (rank, key)
        assert out["weights"].keys() == ref["weights"].keys()
        _same_step(out["weights"], out["exp_avg"], ref)
        for key, weight in ref["weights"].items():
            assert not torch.equal(weight, before[key]), key
            assert torch.equal(out["weights"][key], out["trainer"][key]), (rank, key)  # the reshard is exact
        assert out["redundant_bytes"] == 0, rank


def test_save_pretrained_writes_the_updated_model(ranks, reference):
    from transformers import AutoModelForCausalLM

    results, tmp = ranks
    for name in NAMES:
        saved = AutoModelForCausalLM.from_pretrained(tmp / f"{name}_saved", dtype=torch.float32)
        for key, weight in saved.named_parameters():
            assert torch.equal(weight, results[0][name]["weights"][key]), key


def test_bad_layout_is_one_clear_error():
    from dockflow.engines.megatron.training import MegatronTrainingEngine

    with pytest.raises(RuntimeError, match="torch.distributed initialised"):
        MegatronTrainingEngine(tiny_decoder("llama"), tp=2, lr=1e-3)


def test_a_checkpoint_of_another_engine_is_one_clear_error(tmp_path):
    from dockflow.engines.megatron.persist import MegatronPersistence
    from dockflow.storage import CheckpointError

    gathered = {"model": {}, "optimizer": {}}  # what another engine's worker part holds
    with pytest.raises(CheckpointError, match=r"part 'actor' holds no dist_checkpointing checkpoint .*train\.engine"):
        MegatronPersistence().load_state(LocalCheckpointStore(tmp_path, keep=1), 3, "actor", gathered)
