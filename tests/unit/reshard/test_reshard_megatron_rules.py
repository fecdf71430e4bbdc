"""The Megatron partition rules cut the same shards as the engine's own TP / PP split
(``dockflow.engines.megatron.shard``, checked against real GPTModels in tests/unit/engines/megatron), and the
plan moves them to TP1 in one process with an emulated allgather."""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny_models import tiny_decoder

from dockflow.engines.megatron.convert import hf_to_megatron, spec_from_hf
from dockflow.engines.megatron.shard import shard_state, stage_state
from dockflow.reshard import (
    MEGATRON_RULES,
    MEGATRON_VOCAB_MULTIPLE,
    ModelPartition,
    ParallelLayout,
    PartitionRules,
    UnknownParameterError,
    eq3_inputs,
    global_names,
    megatron_rules,
    param_meta,
)

LAYOUTS = [(2, 1), (1, 2), (2, 2)]


def _megatron(name: str):
    hf = tiny_decoder(name)
    spec = spec_from_hf(hf.config)
    full = hf_to_megatron(hf.state_dict(), spec)
    partition = ModelPartition(param_meta(full), megatron_rules(spec.num_layers, spec.num_kv_heads))
    return spec, full, partition


@pytest.mark.parametrize("name", ["qwen2_untied", "qwen2_tied", "qwen3"])
@pytest.mark.parametrize(("tp", "pp"), LAYOUTS, ids=["tp2", "pp2", "tp2pp2"])
def test_rules_cut_the_engines_shards(name, tp, pp):
    spec, full, partition = _megatron(name)
    layout = ParallelLayout(tp=tp, pp=pp, vocab_multiple=MEGATRON_VOCAB_MULTIPLE)
    for rank in range(layout.size):
        coords = layout.coords(rank)
        engine = stage_state(shard_state(full, spec, tp, coords.tp), spec, pp, coords.pp)
        engine = global_names(engine, spec.num_layers, pp, coords.pp)
        if spec.tied and pp > 1 and coords.pp == pp - 1:
            engine.pop("output_layer.weight")  # the last stage's copy of the tied embedding: not in the full state
        ours = partition.shards(full, layout, rank)
        assert ours.keys() == engine.keys(), rank
        for key, tensor in engine.items():
            assert torch.equal(ours[key], tensor), (rank, key)
        assert all(torch.equal(partition.assemble(k, {rank: t}, layout), full[k]) for k, t in ours.items()
                   if partition.kinds[k] == "replicated")


def test_rules_refuse_what_megatron_refuses():
    _, full, partition = _megatron("qwen2_untied")  # 2 query groups, 2 layers
    with pytest.raises(ValueError, match="query groups = 2 does not split evenly over tp=4"):
        partition.shard_map("decoder.layers.0.self_attention.linear_qkv.weight", ParallelLayout(tp=4), 0)
    with pytest.raises(ValueError, match="pp=4 does not divide the model's 2 layers"):
        partition.shard_map("decoder.layers.0.mlp.linear_fc2.weight", ParallelLayout(pp=4), 0)
    no_stages = ModelPartition(param_meta(full), PartitionRules(rules=MEGATRON_RULES, query_groups=2))
    with pytest.raises(ValueError, match=r"pass PartitionRules\(stages=StageRules\(num_layers\)\)"):
        no_stages.shard_map("decoder.layers.0.mlp.linear_fc2.weight", ParallelLayout(pp=2), 0)
    with pytest.raises(UnknownParameterError, match="'embedding.word_embeddings.weight'"):
        ModelPartition(param_meta(full))  # the HF rules do not know megatron's names
    assert global_names({"decoder.layers.0.mlp.linear_fc1.weight": full["output_layer.weight"]}, 4, 2, 1).keys() == {
        "decoder.layers.2.mlp.linear_fc1.weight"}


@pytest.mark.parametrize(("tp", "pp"), LAYOUTS, ids=["tp2", "pp2", "tp2pp2"])
def test_eq3_counts_split_weights_and_vocab_padding(tp, pp):
    spec, full, partition = _megatron("qwen2_untied")
    update = ParallelLayout(tp=tp, pp=pp, vocab_multiple=MEGATRON_VOCAB_MULTIPLE)
    gen = ParallelLayout(tp=1, dp=tp * pp)
    eq3 = eq3_inputs(partition, update, gen)
    vocab = ("embedding.word_embeddings.weight", "output_layer.weight")
    assert eq3.pad_bytes == sum((128 * tp - spec.vocab_size) * spec.hidden_size * 4 for _ in vocab)
    split = sum(t.numel() * 4 for k, t in full.items() if partition.kinds[k] != "replicated")
    assert eq3.tw_bytes == (split if tp > 1 else 0)
    # naive leaves every split shard (padding included) resident: summed over the ranks, one padded copy
    resident = sum(t.numel() * 4 for r in range(update.size) for k, t in partition.shards(full, update, r).items()
                   if partition.kinds[k] != "replicated" and (tp > 1 or partition.kinds[k] == "vocab_column"))
    if tp == 1:
        resident -= spec.vocab_size * spec.hidden_size * 4 * len(vocab)  # TP1: the vocab rows are used in place
    assert eq3.total == resident


@pytest.mark.parametrize("bucket_bytes", [None, 3000])
@pytest.mark.parametrize(("tp", "pp"), LAYOUTS, ids=["tp2", "pp2", "tp2pp2"])
def test_plan_moves_megatron_shards_to_tp1(tp, pp, bucket_bytes):
    """Every rank ends with the full, unpadded megatron state (emulated allgathers, members agree on buckets)."""
    from test_reshard_routes import emulate

    _, _, partition = _megatron("qwen3")
    update = ParallelLayout(tp=tp, pp=pp, dp=2, vocab_multiple=MEGATRON_VOCAB_MULTIPLE)
    generation, _ = emulate(partition, update, ParallelLayout(tp=1, dp=update.size), bucket_bytes, alias=True)
    assert all(g.keys() == partition.meta.keys() for g in generation)
