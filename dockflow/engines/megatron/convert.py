"""Hugging Face <-> megatron-core weights for the decoder families DockFlow trains: Qwen2/Qwen2.5 (bias on q/k/v),
Qwen3 (RMSNorm on each head's q and k, no q/k/v bias), Llama, and Qwen3-MoE (Qwen3's attention, every layer's MLP
a mixture of experts).

Plain tensor functions: nothing here imports megatron. The megatron side is the full (unsharded) state of a
``GPTModel`` built with megatron-core's local layer spec (``get_gpt_layer_local_spec``), whose names are:

    embedding.word_embeddings.weight                       model.embed_tokens.weight
    decoder.layers.{i}.input_layernorm.weight              model.layers.{i}.input_layernorm.weight
    decoder.layers.{i}.self_attention.linear_qkv.{weight,bias}   q_proj, k_proj, v_proj fused (below)
    decoder.layers.{i}.self_attention.{q,k}_layernorm.weight     self_attn.{q,k}_norm.weight (Qwen3)
    decoder.layers.{i}.self_attention.linear_proj.weight   self_attn.o_proj.weight
    decoder.layers.{i}.pre_mlp_layernorm.weight            post_attention_layernorm.weight
    decoder.layers.{i}.mlp.linear_fc1.weight               [gate_proj; up_proj] stacked on the output dim
    decoder.layers.{i}.mlp.linear_fc2.weight               mlp.down_proj.weight
    decoder.layers.{i}.mlp.router.weight (MoE)             mlp.gate.weight [E, H]
    decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight   mlp.experts.gate_up_proj[e] ([gate; up])
    decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc2.weight   mlp.experts.down_proj[e]
    decoder.final_layernorm.weight                         model.norm.weight
    output_layer.weight (untied only)                      lm_head.weight

``linear_qkv`` groups its output rows by key/value head ("query group"): for each group, the rows of the
query heads that share it, then its key head, then its value head. Tensor parallelism then gives each rank
whole groups (``dockflow.engines.megatron.shard``).

MoE experts are megatron's per-expert ``SequentialMLP`` (the local spec without grouped GEMM: its ``GroupedMLP``
needs the CUDA-only ``grouped_gemm`` package); the full state numbers them globally ``0..E-1``, and expert parallelism
gives EP rank ``r`` the experts ``r*E/EP ..`` as its ``local_experts.0..`` (``shard.expert_state``). Hugging Face
(transformers 5) stacks them: ``gate_up_proj`` [E, 2I, H], gate rows first, as ``linear_fc1`` stacks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

FAMILIES = {"qwen2": "Qwen2/Qwen2.5", "qwen3": "Qwen3", "llama": "Llama", "qwen3_moe": "Qwen3-MoE"}


@dataclass(frozen=True)
class DecoderSpec:
    """What the conversion and the megatron model read of a Hugging Face config."""

    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    norm_eps: float
    rope_theta: float
    max_positions: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool
    num_experts: int = 0  # 0: a dense MLP
    moe_topk: int = 0
    moe_ffn_hidden_size: int = 0
    norm_topk_prob: bool = False  # the top-k probabilities renormalised (softmax over the top-k logits)

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


def _rope_theta(config: Any) -> float:
    """RoPE base from ``rope_parameters`` (transformers 5) or ``rope_theta``; only plain RoPE is supported."""
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"megatron conversion: rope_type {rope_type!r} (RoPE scaling) is not supported yet; "
                         "use a model with plain RoPE (rope_type 'default')")
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def spec_from_hf(config: Any) -> DecoderSpec:
    """The ``DecoderSpec`` of a Hugging Face Qwen2, Qwen3 or Llama config; anything else is one clear error."""
    family = config.model_type
    if family not in FAMILIES:
        raise ValueError(f"megatron conversion: model_type {family!r} is not supported; "
                         f"use one of {', '.join(sorted(FAMILIES))}")
    if config.hidden_act != "silu":
        raise ValueError(f"megatron conversion: hidden_act {config.hidden_act!r} is not supported; only silu (SwiGLU)")
    if getattr(config, "mlp_bias", False):
        raise ValueError("megatron conversion: mlp_bias=True is not supported; use a model without MLP biases")
    if getattr(config, "use_sliding_window", False):
        raise ValueError("megatron conversion: sliding-window attention is not supported; set use_sliding_window=False")
    moe = _moe_fields(config) if family == "qwen3_moe" else {}
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return DecoderSpec(
        family=family,
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        norm_eps=float(config.rms_norm_eps),
        rope_theta=_rope_theta(config),
        max_positions=config.max_position_embeddings,
        tied=bool(config.tie_word_embeddings),
        qkv_bias=True if family == "qwen2" else bool(getattr(config, "attention_bias", False)),
        qk_norm=family in ("qwen3", "qwen3_moe"),
        **moe,
    )


def _moe_fields(config: Any) -> dict[str, Any]:
    """The MoE fields of a Qwen3-MoE config: every layer sparse, no shared experts."""
    layers = config.num_hidden_layers
    dense = [i for i in range(layers)
             if i in (config.mlp_only_layers or []) or (i + 1) % config.decoder_sparse_step]
    if dense:
        raise ValueError(f"megatron conversion: Qwen3-MoE layers {dense} have a dense MLP (mlp_only_layers / "
                         "decoder_sparse_step); only models whose every layer is MoE are supported")
    return dict(num_experts=config.num_experts, moe_topk=config.num_experts_per_tok,
                moe_ffn_hidden_size=config.moe_intermediate_size, norm_topk_prob=bool(config.norm_topk_prob))


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: DecoderSpec) -> torch.Tensor:
    """HF q/k/v projections (weights [out, in] or biases [out]) in megatron's per-group order [q..., k, v]."""
    groups, rest = spec.num_kv_heads, q.shape[1:]
    parts = [
        q.reshape(groups, spec.heads_per_group * spec.head_dim, *rest),
        k.reshape(groups, spec.head_dim, *rest),
        v.reshape(groups, spec.head_dim, *rest),
    ]
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, spec: DecoderSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of ``fuse_qkv``: megatron's ``linear_qkv`` rows back to HF q, k, v."""
    rest, q_rows = qkv.shape[1:], spec.heads_per_group * spec.head_dim
    grouped = qkv.reshape(spec.num_kv_heads, q_rows + 2 * spec.head_dim, *rest)
    q, k, v = torch.split(grouped, [q_rows, spec.head_dim, spec.head_dim], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


# Per-layer tensors that keep their shape, megatron name -> HF name (under ``decoder.layers.{i}.`` and
# ``model.layers.{i}.``).
_LAYER_SAME = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
}
_QK_NORM = {"self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
            "self_attention.k_layernorm.weight": "self_attn.k_norm.weight"}
_DENSE_FC2 = {"mlp.linear_fc2.weight": "mlp.down_proj.weight"}
_ROUTER = {"mlp.router.weight": "mlp.gate.weight"}
EXPERT = "mlp.experts.local_experts."  # megatron's per-expert MLPs, ``{EXPERT}{e}.linear_fc{1,2}.weight``


def _layer_same(spec: DecoderSpec) -> dict[str, str]:
    return {**_LAYER_SAME, **(_QK_NORM if spec.qk_norm else {}), **(_ROUTER if spec.is_moe else _DENSE_FC2)}


def _take(state: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in state:
        raise KeyError(f"megatron conversion: the state has no {name!r}; is it the model the config describes?")
    return state[name]


def hf_to_megatron(hf: dict[str, torch.Tensor], spec: DecoderSpec) -> dict[str, torch.Tensor]:
    """A Hugging Face state dict to the full megatron ``GPTModel`` state (no vocabulary padding, TP=1)."""
    out = {"embedding.word_embeddings.weight": _take(hf, "model.embed_tokens.weight"),
           "decoder.final_layernorm.weight": _take(hf, "model.norm.weight")}
    if not spec.tied:
        out["output_layer.weight"] = _take(hf, "lm_head.weight")
    for i in range(spec.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        for mg_name, hf_name in _layer_same(spec).items():
            out[dst + mg_name] = _take(hf, src + hf_name)
        attn = src + "self_attn."
        out[dst + "self_attention.linear_qkv.weight"] = fuse_qkv(
            *(_take(hf, f"{attn}{p}_proj.weight") for p in "qkv"), spec)
        if spec.qkv_bias:
            out[dst + "self_attention.linear_qkv.bias"] = fuse_qkv(
                *(_take(hf, f"{attn}{p}_proj.bias") for p in "qkv"), spec)
        if spec.is_moe:
            gate_up, down = _take(hf, src + "mlp.experts.gate_up_proj"), _take(hf, src + "mlp.experts.down_proj")
            for e in range(spec.num_experts):
                out[f"{dst}{EXPERT}{e}.linear_fc1.weight"] = gate_up[e]
                out[f"{dst}{EXPERT}{e}.linear_fc2.weight"] = down[e]
        else:
            out[dst + "mlp.linear_fc1.weight"] = torch.cat(
                [_take(hf, src + "mlp.gate_proj.weight"), _take(hf, src + "mlp.up_proj.weight")], dim=0)
    return out


def megatron_to_hf(mg: dict[str, torch.Tensor], spec: DecoderSpec) -> dict[str, torch.Tensor]:
    """The full megatron state (vocabulary unpadded) back to Hugging Face names; a tied model's ``lm_head.weight``
    is the embedding itself, as in ``PreTrainedModel.state_dict()``."""
    embed = _take(mg, "embedding.word_embeddings.weight")
    out = {"model.embed_tokens.weight": embed, "model.norm.weight": _take(mg, "decoder.final_layernorm.weight"),
           "lm_head.weight": embed if spec.tied else _take(mg, "output_layer.weight")}
    for i in range(spec.num_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        for mg_name, hf_name in _layer_same(spec).items():
            out[dst + hf_name] = _take(mg, src + mg_name)
        names = [f"{dst}self_attn.{p}_proj" for p in "qkv"]
        for name, tensor in zip(names, split_qkv(_take(mg, src + "self_attention.linear_qkv.weight"), spec), strict=True):
            out[name + ".weight"] = tensor
        if spec.qkv_bias:
            for name, tensor in zip(names, split_qkv(_take(mg, src + "self_attention.linear_qkv.bias"), spec), strict=True):
                out[name + ".bias"] = tensor
        if spec.is_moe:
            for hf_name, fc in (("gate_up_proj", "linear_fc1"), ("down_proj", "linear_fc2")):
                out[f"{dst}mlp.experts.{hf_name}"] = torch.stack(
                    [_take(mg, f"{src}{EXPERT}{e}.{fc}.weight") for e in range(spec.num_experts)])
        else:
            gate, up = torch.chunk(_take(mg, src + "mlp.linear_fc1.weight"), 2, dim=0)
            out[dst + "mlp.gate_proj.weight"], out[dst + "mlp.up_proj.weight"] = gate, up
    return out
