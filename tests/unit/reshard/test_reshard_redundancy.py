"""Eq. (3) of the paper and the measured redundant bytes of naive resharding."""

import pytest
import torch

from dockflow.reshard import (
    ModelPartition,
    ParallelLayout,
    ParamMeta,
    eq3_ep_per_rank,
    eq3_inputs,
    measured_redundant_bytes,
    predicted_redundant_bytes,
    predicted_redundant_bytes_per_rank,
)

F32 = torch.float32
GB = 1024**3


def test_eq3_as_printed():
    # Fig. 3: TP2EP2DP2 -> TP1EP4DP4 on 4 devices: R = 4 * (TW / 2 + EW / 4)
    assert predicted_redundant_bytes(8 * GB, 40 * GB, update_tp=2, gen_dp=4, gen_ep=4) == 4 * (4 + 10) * GB
    assert predicted_redundant_bytes_per_rank(8 * GB, 40 * GB, update_tp=2, gen_ep=4) == 14 * GB
    # Fig. 10: Qwen2.5-32B in bf16 (64 GB of TP weights), TP8 update: 8 GB per device
    assert predicted_redundant_bytes_per_rank(64 * GB, 0, update_tp=8, gen_ep=1) == 8 * GB
    with pytest.raises(ValueError, match="update_tp must be >= 1"):
        predicted_redundant_bytes(1, 1, update_tp=0, gen_dp=1, gen_ep=1)


def _partition() -> ModelPartition:
    return ModelPartition({
        "model.embed_tokens.weight": ParamMeta((10, 4), F32),  # 160 bytes, TP
        "model.layers.0.self_attn.o_proj.weight": ParamMeta((4, 4), F32),  # 64, TP
        "model.layers.0.input_layernorm.weight": ParamMeta((4,), F32),  # 16, common
        "model.layers.0.mlp.experts.gate_up_proj": ParamMeta((4, 8, 4), F32),  # 512, experts
    })


def test_eq3_inputs_from_a_partition():
    p = _partition()
    inputs = eq3_inputs(p, ParallelLayout(tp=2, dp=2, ep=2), ParallelLayout(tp=1, dp=4, ep=4))
    assert (inputs.tw_bytes, inputs.ew_bytes, inputs.update_tp, inputs.gen_dp, inputs.gen_ep) == (224, 512, 2, 4, 4)
    assert inputs.per_rank == 224 / 2 + 512 / 4 and inputs.total == 4 * inputs.per_rank
    # no TP split in the update layout: no TP term
    assert eq3_inputs(p, ParallelLayout(tp=1, dp=4), ParallelLayout(tp=1, dp=4)).tw_bytes == 0
    # FSDP: every weight is split tp * dp ways
    fsdp = eq3_inputs(p, ParallelLayout(tp=1, dp=4, fsdp=True), ParallelLayout(tp=1, dp=4))
    assert (fsdp.tw_bytes, fsdp.ew_bytes, fsdp.update_tp) == (752, 0, 4) and fsdp.per_rank == 188


def test_measured_redundancy_is_resident_weight_bytes_generation_does_not_use():
    common = torch.zeros(4)
    tp_shard = torch.zeros(8)
    gathered = torch.zeros(16)
    # naive: common used in place, the TP shard left behind beside the gathered full tensor
    assert measured_redundant_bytes([common, tp_shard], [common, gathered], "cpu") == 32
    # allgather-swap: update storages released
    tp_shard.untyped_storage().resize_(0)
    common_copy = common.clone()
    common.untyped_storage().resize_(0)
    assert measured_redundant_bytes([common, tp_shard], [common_copy, gathered], "cpu") == 0


def _naive_redundant_bytes(partition: ModelPartition, update: ParallelLayout, gen: ParallelLayout) -> list[int]:
    """Per rank, what naive resharding's allocation leaves redundant (update shards used in place where they are
    the generation shard or a dim-0 range of it, new tensors for the rest)."""
    from dockflow.reshard.gather import allocate_generation
    from dockflow.reshard.routes import plan_routes

    full = {n: torch.randn(m.shape) for n, m in partition.meta.items()}
    out = []
    for rank in range(update.size):
        shards = partition.shards(full, update, rank)
        generation, _ = allocate_generation(plan_routes(partition, update, gen, rank), shards, torch.device("cpu"),
                                            alias=True)
        out.append(measured_redundant_bytes(shards.values(), generation.values(), "cpu"))
    return out


def _per_expert_partition() -> ModelPartition:
    meta = {f"model.layers.0.mlp.experts.{e}.down_proj.weight": ParamMeta((4, 4), F32) for e in range(4)}  # 64 each
    return ModelPartition({**meta, "model.layers.0.input_layernorm.weight": ParamMeta((4,), F32)})


@pytest.mark.parametrize(("partition", "update", "gen", "expected"), [
    # stacked experts [4, 8, 4] (512 bytes): rank r serves EP rank r % 2's experts {0, 1} / {2, 3} in the update
    (_partition(), ParallelLayout(tp=1, dp=4, ep=2), ParallelLayout(tp=1, dp=4, ep=4), [128, 256, 256, 128]),
    (_partition(), ParallelLayout(tp=1, dp=4, ep=2), ParallelLayout(tp=1, dp=4), [256] * 4),  # all 4 needed: new
    (_partition(), ParallelLayout(tp=2, dp=2, ep=2), ParallelLayout(tp=1, dp=4, ep=4), [224 / 2 + 512 / 4] * 4),
    (_per_expert_partition(), ParallelLayout(tp=1, dp=4, ep=2), ParallelLayout(tp=1, dp=4, ep=4), [64, 128, 128, 64]),
    (_per_expert_partition(), ParallelLayout(tp=1, dp=4, ep=2), ParallelLayout(tp=1, dp=4), [0] * 4),  # megatron's
    (_per_expert_partition(), ParallelLayout(tp=1, dp=4, ep=2), ParallelLayout(tp=1, dp=4, ep=2), [0] * 4),
], ids=["stacked-ep2-ep4", "stacked-ep2-ep1", "fig3-tp2ep2-ep4", "per-expert-ep2-ep4", "per-expert-ep2-ep1",
        "per-expert-ep2-ep2"])
def test_eq3_extended_for_ep_is_what_naive_resharding_leaves_per_rank(partition, update, gen, expected):
    predicted = eq3_ep_per_rank(partition, update, gen)
    assert predicted == expected
    assert _naive_redundant_bytes(partition, update, gen) == expected
    if update.tp == 2:  # Fig. 3: the printed bracket
        assert predicted == [eq3_inputs(partition, update, gen).per_rank] * 4
    with pytest.raises(ValueError, match="models generation TP 1 and update PP 1"):
        eq3_ep_per_rank(partition, update, ParallelLayout(tp=2, dp=2))
