"""The memory model of ``benchmarks.reshard_megatron`` (no processes: the partition of the MoE benchmark model's
megatron names, on the meta device) gives the per-rank bytes docs/reshard.md derives by hand."""

from __future__ import annotations

import pytest

from benchmarks.reshard_megatron import MOE_MODELS, layouts_of, model_spec, predict
from dockflow.reshard import ModelPartition

MIB = 2**20
EXPERT = 3 * MIB  # one expert of qwen3-moe-mg-9m over its 4 layers: 3 x 256 x 256 fp32 per layer
PAD = (4096 - 4000) * 256 * 4 * 2  # the embedding's and the output layer's padded rows


@pytest.mark.parametrize(("ep", "gen_ep", "experts_kept"), [
    (2, 1, [0, 0, 0, 0]),  # every rank keeps serving its 4 experts (and needs the other 4 as well)
    (2, 4, [2, 4, 4, 2]),  # dp % 2 gives ranks 1 and 2 update experts none of which they serve in generation
    (1, 4, [6, 6, 6, 6]),
])
def test_naive_leaves_the_padding_and_the_experts_a_rank_no_longer_serves(ep, gen_ep, experts_kept):
    _, meta, rules = model_spec(next(iter(MOE_MODELS)))
    layouts = layouts_of(1, 1, ep, gen_ep)
    naive = predict(ModelPartition(meta, rules), layouts, "naive", 16 * MIB)
    assert naive["redundant"] == [PAD + n * EXPERT for n in experts_kept]
    swap = predict(ModelPartition(meta, rules), layouts, "allgather_swap", 16 * MIB)
    assert swap["redundant"] == [0] * 4 and swap["gen_resident"] == swap["gen_weights"]
    assert naive["update_state"] == swap["update_state"]
    for rank, weights in enumerate(naive["weights"]):
        state, gen = naive["update_state"][rank], naive["gen_weights"][rank]
        assert state > 4 * weights  # AdamW's steps on top of weights, grads and two moments
        # naive keeps the grads and moments, and beside the generation copy the weights it does not use in place
        assert naive["gen_resident"][rank] == gen + state - weights + naive["redundant"][rank]
