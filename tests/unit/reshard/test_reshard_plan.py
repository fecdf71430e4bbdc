"""Resharding plans, executed in one process with an emulated allgather: every pair of layouts gives the
right generation shards, members agree on their buckets, buckets respect their size, big params are split."""

import pytest
import torch

from dockflow.reshard import ModelPartition, ParallelLayout, ParamMeta, PartitionRules
from dockflow.reshard.gather import allocate_generation, copy_local, pack_bucket, unpack_bucket
from dockflow.reshard.plan import plan_buckets, plan_routes

F32 = torch.float32


def _meta(experts: int = 4) -> dict[str, ParamMeta]:
    """A 1-layer MoE with fused attention and dense MLP names, shapes that exercise FSDP padding."""
    return {
        "model.embed_tokens.weight": ParamMeta((20, 8), F32),
        "model.layers.0.self_attn.qkv_proj.weight": ParamMeta((16, 8), F32),
        "model.layers.0.self_attn.qkv_proj.bias": ParamMeta((16,), F32),
        "model.layers.0.self_attn.o_proj.weight": ParamMeta((8, 8), F32),
        "model.layers.0.input_layernorm.weight": ParamMeta((8,), F32),
        "model.layers.0.mlp.gate.weight": ParamMeta((experts, 8), F32),
        "model.layers.0.mlp.experts.gate_up_proj": ParamMeta((experts, 8, 8), F32),
        "model.layers.0.mlp.experts.down_proj": ParamMeta((experts, 8, 4), F32),
        "model.layers.1.mlp.gate_up_proj.weight": ParamMeta((16, 8), F32),
        "model.layers.1.mlp.down_proj.weight": ParamMeta((8, 8), F32),
        "lm_head.weight": ParamMeta((20, 8), F32),
    }


def emulate(partition, update, gen, bucket_bytes, alias=False):
    """Run every rank's plan, doing each allgather by hand; returns (generation shards, buckets) per rank."""
    world = update.size
    full = {n: torch.randn(m.shape) for n, m in partition.meta.items()}
    shards = [partition.shards(full, update, r) for r in range(world)]
    routes = [plan_routes(partition, update, gen, r) for r in range(world)]
    buckets = [plan_buckets(routes[r], bucket_bytes) for r in range(world)]
    out = []
    for r in range(world):
        generation, aliased = allocate_generation(routes[r], shards[r], torch.device("cpu"), alias)
        copy_local(routes[r], shards[r], generation, set(aliased))
        position = {}
        for bucket in buckets[r]:
            k = position[bucket.holders] = position.get(bucket.holders, -1) + 1
            buffer = torch.empty(bucket.nbytes, dtype=torch.uint8)
            for i, m in enumerate(bucket.members):
                theirs = [b for b in buckets[m] if b.holders == bucket.holders][k]
                assert (theirs.members, theirs.slot_bytes) == (bucket.members, bucket.slot_bytes)
                assert [(it.route.name, it.rows, it.offsets) for it in theirs.items] == \
                       [(it.route.name, it.rows, it.offsets) for it in bucket.items]
                pack_bucket(theirs, buffer[i * bucket.slot_bytes:(i + 1) * bucket.slot_bytes], shards[m], i)
            unpack_bucket(bucket, buffer, generation, set(aliased))
        out.append(generation)
        for name, tensor in full.items():
            expected = partition.shard(name, tensor, gen, r)
            assert (name in generation) == (expected is not None), (name, r)
            if expected is not None:
                assert torch.equal(generation[name], expected), (str(update), str(gen), name, r)
    return out, buckets


PAIRS = [
    (ParallelLayout(tp=2, dp=2), ParallelLayout(tp=1, dp=4)),
    (ParallelLayout(tp=1, dp=4), ParallelLayout(tp=2, dp=2)),
    (ParallelLayout(tp=4, dp=1), ParallelLayout(tp=2, dp=2)),
    (ParallelLayout(tp=2, dp=2, ep=2), ParallelLayout(tp=1, dp=4, ep=4)),
    (ParallelLayout(tp=1, dp=4, ep=4), ParallelLayout(tp=2, dp=2, ep=2)),
    (ParallelLayout(tp=1, dp=4, fsdp=True), ParallelLayout(tp=1, dp=4)),
    (ParallelLayout(tp=2, dp=2, ep=2, fsdp=True), ParallelLayout(tp=4, dp=1)),
]


@pytest.mark.parametrize("bucket_bytes", [None, 2048, 1 << 20])
@pytest.mark.parametrize(("update", "gen"), PAIRS, ids=[f"{u}->{g}" for u, g in PAIRS])
def test_every_layout_pair_gives_the_reference_shards(update, gen, bucket_bytes):
    partition = ModelPartition(_meta(), PartitionRules(qkv_sections=(8, 4, 4)))
    _, buckets = emulate(partition, update, gen, bucket_bytes)
    for per_rank in buckets:
        if bucket_bytes is not None:
            assert all(b.nbytes <= bucket_bytes for b in per_rank)


def test_small_buckets_split_a_parameter_into_row_chunks():
    partition = ModelPartition(_meta(), PartitionRules(qkv_sections=(8, 4, 4)))
    routes = plan_routes(partition, ParallelLayout(tp=2, dp=2), ParallelLayout(tp=1, dp=4), 0)
    buckets = plan_buckets(routes, 512)
    embed = [it for b in buckets for it in b.items if it.route.name == "model.embed_tokens.weight"]
    assert len(embed) > 1  # 10 rows x 32 bytes per TP rank do not fit 512 / 2 bytes at once
    assert [it.rows[0] for it in embed][0][0] == 0 and embed[-1].rows[0][1] == 10
    assert all(b.nbytes <= 512 for b in buckets)


def test_naive_plan_is_one_bucket_per_parameter():
    partition = ModelPartition(_meta(), PartitionRules(qkv_sections=(8, 4, 4)))
    routes = plan_routes(partition, ParallelLayout(tp=2, dp=2), ParallelLayout(tp=1, dp=4), 0)
    buckets = plan_buckets(routes, None)
    assert [len(b.items) for b in buckets] == [1] * len(buckets)
    assert len(buckets) == sum(r.holders is not None for r in routes)


def test_bucket_too_small_for_one_row_says_how_big_it_must_be():
    partition = ModelPartition(_meta(), PartitionRules(qkv_sections=(8, 4, 4)))
    routes = plan_routes(partition, ParallelLayout(tp=2, dp=2), ParallelLayout(tp=1, dp=4), 0)
    with pytest.raises(ValueError, match="bucket_bytes=64 is too small.*needs at least"):
        plan_buckets(routes, 64)


def test_naive_aliases_shards_that_generation_can_use_in_place():
    partition = ModelPartition(_meta(), PartitionRules(qkv_sections=(8, 4, 4)))
    update, gen = ParallelLayout(tp=1, dp=4, ep=2), ParallelLayout(tp=1, dp=4, ep=4)
    full = {n: torch.randn(m.shape) for n, m in partition.meta.items()}
    shards = partition.shards(full, update, 3)  # dp 3 = ep 1 of EP2: experts 2, 3; ep 3 of EP4: expert 3
    routes = plan_routes(partition, update, gen, 3)
    generation, aliased = allocate_generation(routes, shards, torch.device("cpu"), alias=True)
    experts = "model.layers.0.mlp.experts.gate_up_proj"
    assert experts in aliased and "model.layers.0.input_layernorm.weight" in aliased
    assert generation[experts].untyped_storage().data_ptr() == shards[experts].untyped_storage().data_ptr()
    assert torch.equal(generation[experts], full[experts][3:4])
    assert "model.embed_tokens.weight" in aliased  # TP1 -> TP1: the same shard
    two = plan_routes(partition, update, gen, 1)  # dp 1: experts 2, 3 in update, expert 1 in generation
    assert experts not in allocate_generation(two, partition.shards(full, update, 1), torch.device("cpu"), True)[1]


def test_layouts_on_different_world_sizes_are_refused():
    partition = ModelPartition(_meta(), PartitionRules(qkv_sections=(8, 4, 4)))
    with pytest.raises(ValueError, match="same ranks"):
        plan_routes(partition, ParallelLayout(tp=2, dp=2), ParallelLayout(tp=1, dp=2), 0)
