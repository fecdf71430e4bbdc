"""Resharding real megatron-core shards to the generation layout (TP1, every rank a full copy), naive and
allgather-swap, on gloo ranks at TP=2, PP=2 and TP2xPP2.

Each rank builds its ``GPTModel`` (Qwen2 tied and untied, Qwen3), loads the HF weights, takes one AdamW step
through megatron's pipeline schedule and gathers the trainer's full weights the engine's way
(``model.gather_full_state``) as the reference. Then ``naive_reshard`` and ``allgather_swap`` move the rank's
own parameters (``dockflow.reshard.megatron_rules``, global layer names) and ``convert.megatron_to_hf`` names
them: every rank's HF weights must equal the reference exactly; allgather-swap leaves 0 update-state and 0
redundant bytes during generation and restores the state bit-identically; naive's redundant bytes equal Eq. (3)
(UTP := tp * pp, the vocabulary padding counted with TW), summed over the ranks.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from fixtures.ranks import start_ranks
from fixtures.tiny_models import tiny_decoder
from test_megatron_ranks import RESPONSE, loss, rollout

from dockflow.engines.megatron.convert import hf_to_megatron, megatron_to_hf, spec_from_hf
from dockflow.reshard import (
    MEGATRON_VOCAB_MULTIPLE,
    UPDATE_STATE,
    MemoryLedger,
    ModelPartition,
    ParallelLayout,
    ReshardGroups,
    UpdateState,
    allgather_swap,
    eq3_inputs,
    global_names,
    measured_redundant_bytes,
    megatron_rules,
    naive_reshard,
    param_meta,
)

MODELS = ("qwen2_tied", "qwen2_untied", "qwen3")
BUCKET_BYTES = 8192  # several buckets even for the tiny models
# Over 128 (Megatron's padding multiple), as any real vocabulary is: a vocabulary within TP rank 0's padded
# slice would be used in place by naive resharding (as a view), which Eq. (3) does not foresee.
VOCAB = 200


def _clone(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in state.items()}


def _reshard(method: str, model, optimizer, spec, partition, layouts, groups: ReshardGroups) -> dict:
    """One method on this rank's parameters: the HF weights it gives generation and what the ledger saw."""
    update, gen = layouts
    rank = groups.rank
    weights = global_names(dict(model.named_parameters()), spec.num_layers, update.pp, update.coords(rank).pp)
    state = UpdateState(weights, optimizer)
    before = _clone({**weights, **{f"grad/{n}": w.grad for n, w in weights.items()}})
    ledger = MemoryLedger("cpu", rank)
    if method == "naive":
        result = naive_reshard(state, partition, update, gen, groups, ledger=ledger)
    else:
        result = allgather_swap(state, partition, update, gen, groups, bucket_bytes=BUCKET_BYTES, ledger=ledger)
    ready = ledger.snapshots("generation")[-1]
    # with tied embeddings and PP > 1 the last stage's own copy of the embedding is not in the full state
    tied_copy = weights.get("output_layer.weight") if "output_layer.weight" not in partition.meta else None
    out = {
        "hf": _clone(megatron_to_hf(result.generation_weights, spec)),
        "update_state_bytes": sum(ready.by_category[c] for c in UPDATE_STATE),
        "redundant_bytes": measured_redundant_bytes(weights.values(), result.generation_weights.values(), "cpu"),
        "tied_copy_bytes": 0 if tied_copy is None else tied_copy.numel() * tied_copy.element_size(),
        "buckets": result.buckets,
    }
    if result.swap is not None:
        result.swap.swap_back(timeout=60)
    result.release_generation(ledger)
    after = {**weights, **{f"grad/{n}": w.grad for n, w in weights.items()}}
    out["changed_after_swap_back"] = sorted(n for n, t in before.items() if not torch.equal(after[n], t))
    return out


def _rank(rank: int, layout: tuple[int, int], store_path: str, out_dir: str) -> None:
    from dockflow.engines.megatron import model as mg
    from dockflow.engines.megatron.schedule import finalize_grads, pipeline_forward_backward

    tp, pp = layout
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, tp * pp), rank=rank, world_size=tp * pp,
                            timeout=timedelta(seconds=60))
    mg.init_model_parallel(tp=tp, pp=pp, seed=0, device="cpu")
    update = ParallelLayout(tp=tp, pp=pp, vocab_multiple=MEGATRON_VOCAB_MULTIPLE)
    layouts = (update, ParallelLayout(tp=1, dp=tp * pp))
    groups = ReshardGroups(update)
    ids, mask = rollout()
    result = {}
    for name in MODELS:
        hf = tiny_decoder(name, VOCAB)
        spec = spec_from_hf(hf.config)
        full = hf_to_megatron(hf.state_dict(), spec)
        model = mg.build_gpt_model(spec, tp=tp, pp=pp)
        mg.load_full_state(model, full, spec)
        model.train()
        pipeline_forward_backward(model, ids, mask, RESPONSE, spec.vocab_size, micro_batch_size=2,
                                  loss_fn=lambda outputs, rows: loss(outputs.values, mask[rows]))
        finalize_grads(model, spec)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        optimizer.step()
        partition = ModelPartition(param_meta(full), megatron_rules(spec.num_layers, spec.num_kv_heads))
        result[name] = {"trainer": _clone(megatron_to_hf(mg.gather_full_state(model, spec), spec)),
                        "eq3": eq3_inputs(partition, *layouts)}
        for method in ("naive", "allgather_swap"):
            result[name][method] = _reshard(method, model, optimizer, spec, partition, layouts, groups)
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    mg.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=[(2, 1), (1, 2), (2, 2)], ids=["tp2", "pp2", "tp2pp2"])
def ranks(request, tmp_path_factory) -> list[dict]:
    tp, pp = request.param
    tmp = tmp_path_factory.mktemp(f"megatron_reshard_tp{tp}pp{pp}")
    start_ranks(_rank, (request.param, str(tmp / "store"), str(tmp)), tp * pp)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(tp * pp)]


@pytest.mark.parametrize("method", ["naive", "allgather_swap"])
@pytest.mark.parametrize("name", MODELS)
def test_every_rank_gets_the_trainers_hf_weights(ranks, name, method):
    initial = tiny_decoder(name, VOCAB).state_dict()
    trainer = ranks[0][name]["trainer"]
    assert trainer.keys() == initial.keys()
    assert not torch.equal(trainer["model.layers.0.mlp.down_proj.weight"], initial["model.layers.0.mlp.down_proj.weight"])
    for rank, r in enumerate(ranks):
        got = r[name][method]["hf"]
        assert got.keys() == trainer.keys(), rank
        for key, tensor in trainer.items():
            assert torch.equal(got[key], tensor), (rank, key)
        assert r[name][method]["changed_after_swap_back"] == [], rank


@pytest.mark.parametrize("name", MODELS)
def test_allgather_swap_leaves_nothing_redundant_in_generation(ranks, name):
    for rank, r in enumerate(ranks):
        swapped = r[name]["allgather_swap"]
        assert swapped["update_state_bytes"] == 0 and swapped["redundant_bytes"] == 0, rank
        assert swapped["buckets"] > 1, rank


@pytest.mark.parametrize("name", MODELS)
def test_naive_redundancy_matches_eq3(ranks, name):
    eq3 = ranks[0][name]["eq3"]
    naive = [r[name]["naive"] for r in ranks]
    assert all(n["update_state_bytes"] > 0 for n in naive)
    measured = sum(n["redundant_bytes"] - n["tied_copy_bytes"] for n in naive)
    assert measured == eq3.total > 0
