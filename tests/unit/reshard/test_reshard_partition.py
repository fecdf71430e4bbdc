"""Partition rules: kinds of the real transformers parameter names, TP / EP / fused / FSDP shards, the
inverse (assemble), unknown names and user overrides."""

import pytest
import torch

from dockflow.reshard import (
    ModelPartition,
    ParallelLayout,
    ParamMeta,
    PartitionRules,
    UnknownParameterError,
    param_meta,
    qkv_sections_from_config,
)

F32 = torch.float32


def _meta_model(kind: str) -> torch.nn.Module:
    if kind == "qwen2":
        from transformers.models.qwen2 import Qwen2Config as Config
        from transformers.models.qwen2 import Qwen2ForCausalLM as Model
    elif kind == "qwen2_moe":
        from transformers.models.qwen2_moe import Qwen2MoeConfig as Config
        from transformers.models.qwen2_moe import Qwen2MoeForCausalLM as Model
    else:
        from transformers.models.qwen3_moe import Qwen3MoeConfig as Config
        from transformers.models.qwen3_moe import Qwen3MoeForCausalLM as Model
    config = Config(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                    shared_expert_intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                    num_key_value_heads=2, num_experts=4, num_experts_per_tok=2)
    with torch.device("meta"):
        return Model(config)


@pytest.mark.parametrize("model", ["qwen2", "qwen2_moe", "qwen3_moe"])
def test_default_rules_cover_every_transformers_parameter(model):
    partition = ModelPartition(param_meta(_meta_model(model)))
    kinds = partition.kinds
    assert kinds["model.embed_tokens.weight"] == kinds["lm_head.weight"] == "column"
    assert kinds["model.layers.0.self_attn.q_proj.weight"] == kinds["model.layers.0.self_attn.k_proj.weight"] == "column"
    assert kinds["model.layers.0.self_attn.o_proj.weight"] == "row"
    assert kinds["model.layers.0.input_layernorm.weight"] == kinds["model.norm.weight"] == "replicated"
    if model == "qwen2":
        assert kinds["model.layers.0.self_attn.v_proj.bias"] == "column"
        assert kinds["model.layers.0.mlp.up_proj.weight"] == "column"
        assert kinds["model.layers.0.mlp.down_proj.weight"] == "row"
    else:
        assert kinds["model.layers.0.mlp.gate.weight"] == "replicated"  # router
        assert kinds["model.layers.0.mlp.experts.gate_up_proj"] == "stacked_expert_fused_gate_up"
        assert kinds["model.layers.0.mlp.experts.down_proj"] == "stacked_expert_row"
    if model == "qwen2_moe":
        assert kinds["model.layers.0.mlp.shared_expert.gate_proj.weight"] == "column"
        assert kinds["model.layers.0.mlp.shared_expert.down_proj.weight"] == "row"
        assert kinds["model.layers.0.mlp.shared_expert_gate.weight"] == "replicated"
    if model == "qwen3_moe":
        assert kinds["model.layers.0.self_attn.q_norm.weight"] == "replicated"


def _full(meta: dict[str, ParamMeta]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {n: torch.randn(m.shape, generator=gen) for n, m in meta.items()}


def test_column_and_row_split_dims():
    meta = {"l.q_proj.weight": ParamMeta((8, 4), F32), "l.o_proj.weight": ParamMeta((4, 8), F32),
            "l.o_proj.bias": ParamMeta((4,), F32)}
    partition, full = ModelPartition(meta), _full(meta)
    layout = ParallelLayout(tp=2, dp=1)
    assert torch.equal(partition.shard("l.q_proj.weight", full["l.q_proj.weight"], layout, 1), full["l.q_proj.weight"][4:])
    assert torch.equal(partition.shard("l.o_proj.weight", full["l.o_proj.weight"], layout, 1), full["l.o_proj.weight"][:, 4:])
    assert torch.equal(partition.shard("l.o_proj.bias", full["l.o_proj.bias"], layout, 1), full["l.o_proj.bias"])


def test_fused_qkv_gives_each_tp_rank_its_q_k_v_slices():
    q, k, v = torch.arange(8.0), 100 + torch.arange(4.0), 200 + torch.arange(4.0)
    fused = torch.cat([q, k, v]).unsqueeze(1).repeat(1, 3)  # rows [q; k; v], 3 columns
    meta = {"m.layers.0.self_attn.qkv_proj.weight": ParamMeta((16, 3), F32)}
    partition = ModelPartition(meta, PartitionRules(qkv_sections=(8, 4, 4)))
    layout = ParallelLayout(tp=2, dp=2)
    shard = partition.shard("m.layers.0.self_attn.qkv_proj.weight", fused, layout, 1)
    assert shard[:, 0].tolist() == [*q[4:].tolist(), *k[2:].tolist(), *v[2:].tolist()]
    assert not torch.equal(shard, fused.chunk(2)[1])  # not the naive contiguous chunk
    shards = {r: partition.shard("m.layers.0.self_attn.qkv_proj.weight", fused, layout, r) for r in range(4)}
    assert torch.equal(partition.assemble("m.layers.0.self_attn.qkv_proj.weight", shards, layout), fused)


def test_fused_qkv_without_sections_says_how_to_give_them():
    partition = ModelPartition({"x.qkv_proj.weight": ParamMeta((16, 3), F32)})
    with pytest.raises(ValueError, match="qkv_sections_from_config"):
        partition.shard_map("x.qkv_proj.weight", ParallelLayout(tp=2), 0)


def test_qkv_sections_from_config():
    from transformers.models.qwen2 import Qwen2Config

    config = Qwen2Config(hidden_size=64, num_attention_heads=8, num_key_value_heads=2)
    assert qkv_sections_from_config(config) == (64, 16, 16)


def test_fused_gate_up_splits_each_half():
    gate, up = torch.arange(4.0), 10 + torch.arange(4.0)
    full = torch.cat([gate, up]).unsqueeze(1)
    partition = ModelPartition({"l.mlp.gate_up_proj.weight": ParamMeta((8, 1), F32)})
    shard = partition.shard("l.mlp.gate_up_proj.weight", full, ParallelLayout(tp=2), 0)
    assert shard[:, 0].tolist() == [0.0, 1.0, 10.0, 11.0]


def test_stacked_experts_split_over_ep_then_tp_inside():
    experts, inter, hidden = 4, 4, 2
    full = torch.randn(experts, 2 * inter, hidden)
    down = torch.randn(experts, hidden, inter)
    meta = {"l.mlp.experts.gate_up_proj": ParamMeta(tuple(full.shape), F32),
            "l.mlp.experts.down_proj": ParamMeta(tuple(down.shape), F32)}
    partition = ModelPartition(meta)
    layout = ParallelLayout(tp=2, dp=2, ep=2)  # rank 3: ep 1, tp 1
    got = partition.shard("l.mlp.experts.gate_up_proj", full, layout, 3)
    want = torch.cat([full[2:, 2:4], full[2:, 6:8]], dim=1)  # experts 2, 3; second half of gate and of up
    assert torch.equal(got, want)
    assert torch.equal(partition.shard("l.mlp.experts.down_proj", down, layout, 3), down[2:, :, 2:])


def test_per_expert_names_live_on_one_ep_rank():
    meta = {f"l.mlp.experts.{e}.{p}.weight": ParamMeta((4, 2) if p != "down_proj" else (2, 4), F32)
            for e in range(4) for p in ("gate_proj", "up_proj", "down_proj")}
    partition, full = ModelPartition(meta), _full(meta)
    layout = ParallelLayout(tp=1, dp=4, ep=4)
    assert sorted(partition.shards(full, layout, 2)) == [f"l.mlp.experts.2.{p}.weight" for p in ("down_proj", "gate_proj", "up_proj")]
    tp_layout = ParallelLayout(tp=2, dp=2, ep=2)
    shard = partition.shard("l.mlp.experts.3.down_proj.weight", full["l.mlp.experts.3.down_proj.weight"], tp_layout, 3)
    assert torch.equal(shard, full["l.mlp.experts.3.down_proj.weight"][:, 2:])
    assert partition.shard("l.mlp.experts.3.down_proj.weight", full["l.mlp.experts.3.down_proj.weight"], tp_layout, 0) is None


def test_fsdp_chunks_dim0_with_padding_like_fsdp2():
    meta = {"model.embed_tokens.weight": ParamMeta((10, 3), F32), "model.norm.weight": ParamMeta((3,), F32)}
    partition, full = ModelPartition(meta), _full(meta)
    layout = ParallelLayout(tp=1, dp=4, fsdp=True)
    emb = full["model.embed_tokens.weight"]
    shards = [partition.shard("model.embed_tokens.weight", emb, layout, r) for r in range(4)]
    assert [tuple(s.shape) for s in shards] == [(3, 3)] * 4  # ceil(10 / 4) rows each
    assert torch.equal(shards[3][:1], emb[9:]) and not shards[3][1:].any()  # last chunk: 1 row + padding
    for shard, chunk in zip(shards, torch.chunk(emb, 4), strict=True):  # torch.chunk's rows, as FSDP2 uses
        assert torch.equal(shard[: len(chunk)], chunk)
    norms = {r: partition.shard("model.norm.weight", full["model.norm.weight"], layout, r) for r in range(4)}
    assert [tuple(n.shape) for n in norms.values()] == [(1,)] * 4  # ceil(3 / 4) = 1; rank 3 is all padding
    assert torch.equal(partition.assemble("model.norm.weight", norms, layout), full["model.norm.weight"])


@pytest.mark.parametrize("layout", [ParallelLayout(tp=2, dp=2), ParallelLayout(tp=2, dp=2, ep=2),
                                    ParallelLayout(tp=1, dp=4, ep=4), ParallelLayout(tp=2, dp=2, ep=2, fsdp=True)])
def test_assemble_inverts_shard_for_a_moe_model(layout):
    partition = ModelPartition(param_meta(_meta_model("qwen3_moe")))
    full = _full(partition.meta)
    for name, tensor in full.items():
        shards = {r: s for r in range(4) if (s := partition.shard(name, tensor, layout, r)) is not None}
        assert torch.equal(partition.assemble(name, shards, layout), tensor), name


def test_assemble_reports_missing_coverage():
    meta = {"a.q_proj.weight": ParamMeta((4, 2), F32)}
    partition, full = ModelPartition(meta), _full(meta)
    layout = ParallelLayout(tp=2, dp=1)
    with pytest.raises(ValueError, match="cover 4 of 8 elements"):
        partition.assemble("a.q_proj.weight", {0: partition.shard("a.q_proj.weight", full["a.q_proj.weight"], layout, 0)}, layout)


def test_unknown_parameter_names_the_parameter_and_how_to_add_a_rule():
    with pytest.raises(UnknownParameterError, match=r"'model.layers.0.mystery.weight' \(shape \(3,\)\).*overrides="):
        ModelPartition({"model.layers.0.mystery.weight": ParamMeta((3,), F32)})


def test_user_override_wins_over_defaults():
    meta = {"model.layers.0.mystery.weight": ParamMeta((4, 2), F32), "model.layers.0.mlp.down_proj.weight": ParamMeta((2, 4), F32)}
    rules = PartitionRules(overrides={r"mystery\.weight$": "column", r"down_proj\.weight$": "replicated"})
    partition = ModelPartition(meta, rules)
    assert partition.kinds == {"model.layers.0.mystery.weight": "column", "model.layers.0.mlp.down_proj.weight": "replicated"}
    with pytest.raises(ValueError, match="unknown kind 'diagonal'"):
        PartitionRules(overrides={"x": "diagonal"})
    with pytest.raises(ValueError, match="not a valid regex"):
        PartitionRules(overrides={"(": "column"})


def test_uneven_splits_name_the_parameter_and_the_size():
    partition = ModelPartition({"a.q_proj.weight": ParamMeta((6, 2), F32), "l.mlp.experts.down_proj": ParamMeta((3, 2, 2), F32)})
    with pytest.raises(ValueError, match="'a.q_proj.weight'.*does not split evenly over tp=4"):
        partition.shard_map("a.q_proj.weight", ParallelLayout(tp=4), 0)
    with pytest.raises(ValueError, match="'l.mlp.experts.down_proj'.*over ep=2"):
        partition.shard_map("l.mlp.experts.down_proj", ParallelLayout(tp=1, dp=2, ep=2), 0)
    with pytest.raises(ValueError, match=r"pipeline stages: pass PartitionRules\(stages="):
        partition.shard_map("a.q_proj.weight", ParallelLayout(tp=1, pp=2), 0)
    with pytest.raises(ValueError, match="pipeline stages with FSDP or experts are not supported"):
        partition.shard_map("l.mlp.experts.down_proj", ParallelLayout(tp=1, dp=2, ep=2, pp=2), 0)
