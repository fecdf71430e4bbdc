"""HF <-> Megatron weights and their TP shards: plain tensors, no megatron import (the model-level parity is
test_megatron_ranks.py)."""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny_models import DECODERS, tiny_decoder
from transformers import GPT2Config, Qwen2Config

from dockflow.engines.megatron.convert import (
    fuse_qkv,
    hf_to_megatron,
    megatron_to_hf,
    spec_from_hf,
    split_qkv,
)
from dockflow.engines.megatron.shard import (
    check_pp,
    check_tp,
    merge_shards,
    merge_stages,
    padded_vocab_size,
    shard_state,
    stage_state,
)


@pytest.mark.parametrize("name", list(DECODERS))
def test_hf_megatron_hf_round_trip_is_exact(name):
    model = tiny_decoder(name)
    spec = spec_from_hf(model.config)
    hf = model.state_dict()
    mg = hf_to_megatron(hf, spec)
    assert ("output_layer.weight" in mg) == (not spec.tied)
    assert any(k.endswith("linear_qkv.bias") for k in mg) == (name.startswith("qwen2"))
    assert any(k.endswith("q_layernorm.weight") for k in mg) == (name == "qwen3")
    back = megatron_to_hf(mg, spec)
    assert back.keys() == hf.keys()
    for key, tensor in hf.items():
        assert torch.equal(back[key], tensor), key


def test_spec_reads_each_family():
    specs = {name: spec_from_hf(tiny_decoder(name).config) for name in DECODERS}
    assert specs["qwen2_tied"].tied and not specs["qwen2_untied"].tied
    assert specs["qwen2_tied"].qkv_bias and not specs["qwen3"].qkv_bias and not specs["llama"].qkv_bias
    assert specs["qwen3"].qk_norm and specs["qwen3"].head_dim == 16  # not hidden / heads (8)
    assert specs["llama"].rope_theta == 5e5 and specs["qwen2_tied"].rope_theta == 10000.0
    assert (specs["llama"].num_heads, specs["llama"].num_kv_heads, specs["llama"].heads_per_group) == (4, 2, 2)


def test_fused_qkv_is_grouped_q_then_k_then_v():
    """4 query heads over 2 groups, head_dim 1: rows [q0 q1 k0 v0 | q2 q3 k1 v1]."""
    spec = spec_from_hf(Qwen2Config(hidden_size=4, num_attention_heads=4, num_key_value_heads=2,
                                    intermediate_size=8, vocab_size=8, num_hidden_layers=1))
    spec = type(spec)(**{**spec.__dict__, "head_dim": 1})
    q, k, v = torch.tensor([10.0, 11, 12, 13]), torch.tensor([20.0, 21]), torch.tensor([30.0, 31])
    fused = fuse_qkv(q, k, v, spec)
    assert fused.tolist() == [10, 11, 20, 30, 12, 13, 21, 31]
    assert [t.tolist() for t in split_qkv(fused, spec)] == [q.tolist(), k.tolist(), v.tolist()]


def test_fc1_stacks_gate_over_up():
    model = tiny_decoder("llama")
    mg = hf_to_megatron(model.state_dict(), spec_from_hf(model.config))
    layer = model.model.layers[1].mlp
    fc1 = mg["decoder.layers.1.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:48], layer.gate_proj.weight) and torch.equal(fc1[48:], layer.up_proj.weight)


@pytest.mark.parametrize("name", ["qwen2_tied", "qwen3"])
def test_tp2_shards_merge_back_exactly(name):
    model = tiny_decoder(name)
    spec = spec_from_hf(model.config)
    full = hf_to_megatron(model.state_dict(), spec)
    shards = [shard_state(full, spec, tp=2, rank=r, divisible_by=8) for r in range(2)]
    assert padded_vocab_size(40, 2, 8) == 48
    assert shards[0]["embedding.word_embeddings.weight"].shape == (24, 32)
    assert torch.count_nonzero(shards[1]["embedding.word_embeddings.weight"][16:]) == 0  # vocab padding
    qkv = full["decoder.layers.0.self_attention.linear_qkv.weight"]
    rows = qkv.shape[0] // 2  # one query group per rank
    assert torch.equal(shards[1]["decoder.layers.0.self_attention.linear_qkv.weight"], qkv[rows:])
    fc1 = full["decoder.layers.0.mlp.linear_fc1.weight"]  # [gate (48); up (48)]: rank 1 holds gate[24:], up[24:]
    assert torch.equal(shards[1]["decoder.layers.0.mlp.linear_fc1.weight"], torch.cat([fc1[24:48], fc1[72:]]))
    proj = full["decoder.layers.0.self_attention.linear_proj.weight"]
    assert torch.equal(shards[0]["decoder.layers.0.self_attention.linear_proj.weight"], proj[:, : proj.shape[1] // 2])
    merged = merge_shards(shards, spec)
    assert merged.keys() == full.keys()
    for key, tensor in full.items():
        assert torch.equal(merged[key], tensor), key


@pytest.mark.parametrize("name", ["qwen2_tied", "llama"])
def test_pp2_stages_number_their_layers_from_zero_and_merge_back_exactly(name):
    model = tiny_decoder(name)
    spec = spec_from_hf(model.config)
    full = hf_to_megatron(model.state_dict(), spec)
    first, last = (stage_state(full, spec, pp=2, stage=s) for s in range(2))
    assert torch.equal(last["decoder.layers.0.mlp.linear_fc1.weight"], full["decoder.layers.1.mlp.linear_fc1.weight"])
    assert not any(k.startswith("decoder.layers.1.") for k in [*first, *last])
    assert "decoder.final_layernorm.weight" in last and "decoder.final_layernorm.weight" not in first
    assert "embedding.word_embeddings.weight" in first and "embedding.word_embeddings.weight" not in last
    head = full["output_layer.weight"] if "output_layer.weight" in full else full["embedding.word_embeddings.weight"]
    assert torch.equal(last["output_layer.weight"], head)  # tied: the last stage's copy of the embedding
    merged = merge_stages([first, last], spec)
    assert merged.keys() == full.keys()
    for key, tensor in full.items():
        assert torch.equal(merged[key], tensor), key


def test_bad_inputs_name_the_setting():
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        spec_from_hf(GPT2Config())
    scaled = Qwen2Config(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0})
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        spec_from_hf(scaled)
    with pytest.raises(ValueError, match=r"train.tp=4 must divide the model's key/value heads \(2\)"):
        check_tp(spec_from_hf(tiny_decoder("llama").config), 4)
    with pytest.raises(ValueError, match=r"train.pp=3 must divide the model's layers \(2\)"):
        check_pp(spec_from_hf(tiny_decoder("llama").config), 3)
    with pytest.raises(KeyError, match="model.norm.weight"):
        hf_to_megatron({"model.embed_tokens.weight": torch.zeros(1)}, spec_from_hf(tiny_decoder("llama").config))
