"""Qwen3-MoE HF <-> Megatron weights and their EP shards: plain tensors, no megatron import (the model-level parity
at EP=2 is test_megatron_moe.py)."""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny_models import tiny_decoder, tiny_moe

from dockflow.engines.megatron.convert import EXPERT, hf_to_megatron, megatron_to_hf, spec_from_hf
from dockflow.engines.megatron.shard import check_ep, expert_state, merge_experts, merge_shards, shard_state


@pytest.mark.parametrize("tied", [True, False])
def test_moe_hf_megatron_hf_round_trip_is_exact(tied):
    model = tiny_moe(tied=tied)
    spec = spec_from_hf(model.config)
    hf = model.state_dict()
    mg = hf_to_megatron(hf, spec)
    experts = model.model.layers[1].mlp.experts
    for e in range(4):  # gate_up_proj[e] is [gate; up] as linear_fc1 stacks them
        assert torch.equal(mg[f"decoder.layers.1.{EXPERT}{e}.linear_fc1.weight"], experts.gate_up_proj[e])
        assert torch.equal(mg[f"decoder.layers.1.{EXPERT}{e}.linear_fc2.weight"], experts.down_proj[e])
    assert torch.equal(mg["decoder.layers.0.mlp.router.weight"], model.model.layers[0].mlp.gate.weight)
    assert not any(k.endswith(("mlp.linear_fc1.weight", "mlp.linear_fc2.weight")) for k in mg)  # no dense MLP
    back = megatron_to_hf(mg, spec)
    assert back.keys() == hf.keys()
    for key, tensor in hf.items():
        assert torch.equal(back[key], tensor), key


def test_the_spec_reads_the_experts_and_the_top_k_normalisation():
    spec = spec_from_hf(tiny_moe().config)
    assert (spec.family, spec.num_experts, spec.moe_topk, spec.moe_ffn_hidden_size) == ("qwen3_moe", 4, 2, 16)
    assert spec.is_moe and spec.norm_topk_prob and spec.qk_norm and spec.head_dim == 16 and not spec.qkv_bias
    assert not spec_from_hf(tiny_moe(norm_topk_prob=False).config).norm_topk_prob
    assert not spec_from_hf(tiny_decoder("qwen3").config).is_moe


def test_ep2_gives_each_rank_half_the_experts_renumbered_and_merges_back_exactly():
    model = tiny_moe()
    spec = spec_from_hf(model.config)
    full = hf_to_megatron(model.state_dict(), spec)
    ranks = [expert_state(full, spec, ep=2, rank=r) for r in range(2)]
    assert torch.equal(ranks[1][f"decoder.layers.0.{EXPERT}0.linear_fc1.weight"],
                       full[f"decoder.layers.0.{EXPERT}2.linear_fc1.weight"])  # rank 1's first is expert 2
    assert not any(f"{EXPERT}2." in k for r in ranks for k in r)
    assert ranks[0]["decoder.layers.0.mlp.router.weight"] is full["decoder.layers.0.mlp.router.weight"]  # every rank
    merged = merge_experts(ranks, spec)
    assert merged.keys() == full.keys()
    for key, tensor in full.items():
        assert torch.equal(merged[key], tensor), key
    shards = [shard_state(full, spec, tp=2, rank=r, divisible_by=8) for r in range(2)]  # experts are not TP-split
    expert = f"decoder.layers.0.{EXPERT}3.linear_fc2.weight"
    assert torch.equal(shards[1][expert], full[expert])
    assert all(torch.equal(merge_shards(shards, spec)[k], t) for k, t in full.items())


def test_bad_settings_name_the_setting():
    moe = spec_from_hf(tiny_moe().config)
    with pytest.raises(ValueError, match=r"^train.ep=3 must divide the model's experts \(4\)"):
        check_ep(moe, 3)
    with pytest.raises(ValueError, match=r"^train.ep=2 splits a mixture of experts, but the model \(qwen3\) has a dense"):
        check_ep(spec_from_hf(tiny_decoder("qwen3").config), 2)
    check_ep(spec_from_hf(tiny_decoder("qwen3").config), 1)
    config = tiny_moe().config
    config.mlp_only_layers = [1]
    with pytest.raises(ValueError, match=r"Qwen3-MoE layers \[1\] have a dense MLP"):
        spec_from_hf(config)
