"""Tensor- and pipeline-parallel shards of the full megatron state (``convert.hf_to_megatron``) and back.

megatron-core's parallel linears split the local spec's parameters like this (``partition_dim`` on each
parameter of a built ``GPTModel``):

- column-parallel, split on dim 0: ``linear_qkv`` (weight and bias; whole query groups per rank, which is what
  the grouped row order of ``convert.fuse_qkv`` makes a contiguous chunk), ``linear_fc1`` (gate and up each
  split, then stacked again per rank, since the rank's SwiGLU chunks its own rows in two), the word
  embedding and ``output_layer`` (the vocabulary, padded first);
- row-parallel, split on dim 1: ``linear_proj``, ``linear_fc2``;
- replicated: the norms (``q_layernorm`` / ``k_layernorm`` act on one head, so every rank holds them whole).

The vocabulary is padded to a multiple of ``divisible_by * tp`` with zero rows, as Megatron-LM does
(``--make-vocab-size-divisible-by``, 128 by default); a model built for the padded size must never let the
padding rows' logits into a softmax (``vocab_parallel_head`` leaves them out).

Pipeline stages (``stage_state``) take an even share of the layers, as megatron's default split does.

Expert parallelism (``expert_state``) gives EP rank ``r`` of ``ep`` the experts ``r*E/ep .. (r+1)*E/ep - 1`` of every
MoE layer, numbered from 0 as its ``local_experts``; experts are not split by TP (expert TP size 1), and everything
else is the same on every EP rank.
"""

from __future__ import annotations

import torch

from dockflow.engines.megatron.convert import EXPERT, DecoderSpec

VOCAB_PARAMS = ("embedding.word_embeddings.weight", "output_layer.weight")
_COLUMN = ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias")
_ROW = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
_GATE_UP = "mlp.linear_fc1.weight"


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = 128) -> int:
    """The vocabulary rounded up to a multiple of ``divisible_by * tp``."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def check_tp(spec: DecoderSpec, tp: int) -> None:
    """One clear error when ``tp`` cannot split the model's heads, query groups or MLP evenly."""
    for what, count in (("attention heads", spec.num_heads), ("key/value heads", spec.num_kv_heads),
                        ("MLP width (intermediate_size)", spec.ffn_hidden_size)):
        if tp < 1 or count % tp:
            raise ValueError(f"train.tp={tp} must divide the model's {what} ({count}); pick a tp that divides it")


def _kind(name: str) -> str:
    """'vocab', 'column', 'gate_up', 'row' or 'replicated' for a full-state parameter name."""
    if name in VOCAB_PARAMS:
        return "vocab"
    if name.endswith(_COLUMN):
        return "column"
    if name.endswith(_GATE_UP):
        return "gate_up"
    if name.endswith(_ROW):
        return "row"
    return "replicated"


def shard_state(
    full: dict[str, torch.Tensor], spec: DecoderSpec, tp: int, rank: int, divisible_by: int = 128
) -> dict[str, torch.Tensor]:
    """The tensors TP rank ``rank`` of ``tp`` holds, vocabulary padded (contiguous copies)."""
    check_tp(spec, tp)
    padded = padded_vocab_size(spec.vocab_size, tp, divisible_by)
    out = {}
    for name, tensor in full.items():
        kind = _kind(name)
        if kind == "vocab":
            pad = tensor.new_zeros(padded - tensor.shape[0], *tensor.shape[1:])
            tensor = torch.cat([tensor, pad]).chunk(tp, dim=0)[rank]
        elif kind == "column":
            tensor = tensor.chunk(tp, dim=0)[rank]
        elif kind == "gate_up":
            gate, up = tensor.chunk(2, dim=0)
            tensor = torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]])
        elif kind == "row":
            tensor = tensor.chunk(tp, dim=1)[rank]
        out[name] = tensor.clone().contiguous()
    return out


def merge_shards(shards: list[dict[str, torch.Tensor]], spec: DecoderSpec) -> dict[str, torch.Tensor]:
    """The full state from every TP rank's shard (in rank order), vocabulary padding removed."""
    out = {}
    for name, first in shards[0].items():
        parts = [s[name] for s in shards]
        kind = _kind(name)
        if kind in ("vocab", "column"):
            tensor = torch.cat(parts, dim=0)
            if kind == "vocab":
                tensor = tensor[: spec.vocab_size]
        elif kind == "gate_up":
            halves = [p.chunk(2, dim=0) for p in parts]
            tensor = torch.cat([h[0] for h in halves] + [h[1] for h in halves])
        elif kind == "row":
            tensor = torch.cat(parts, dim=1)
        else:
            tensor = first
        out[name] = tensor
    return out


def check_ep(spec: DecoderSpec, ep: int, tp: int = 1) -> None:
    """One clear error when ``ep`` cannot split the model's experts evenly, the model has none to split, or
    megatron's MoE layer cannot train at ``tp``."""
    if ep < 1:
        raise ValueError(f"train.ep={ep} must be at least 1")
    if spec.is_moe and tp > 1:
        raise ValueError(f"train.tp={tp} with a mixture of experts: megatron-core trains MoE at TP > 1 only with "
                         "sequence parallelism, which its local spec's norm refuses; set train.tp=1 (train.ep splits "
                         "the experts)")
    if ep > 1 and not spec.is_moe:
        raise ValueError(f"train.ep={ep} splits a mixture of experts, but the model ({spec.family}) has a dense MLP; "
                         "set train.ep=1")
    if spec.is_moe and spec.num_experts % ep:
        raise ValueError(f"train.ep={ep} must divide the model's experts ({spec.num_experts}); pick an ep that "
                         "divides it")


def _expert(name: str) -> tuple[str, int, str] | None:
    """(prefix, expert number, rest) of an expert's parameter name, else None."""
    if EXPERT not in name:
        return None
    head, tail = name.split(EXPERT, 1)
    number, rest = tail.split(".", 1)
    return head + EXPERT, int(number), rest


def expert_state(state: dict[str, torch.Tensor], spec: DecoderSpec, ep: int, rank: int) -> dict[str, torch.Tensor]:
    """The tensors EP rank ``rank`` of ``ep`` holds: its experts renumbered from 0, every other tensor."""
    check_ep(spec, ep)
    local = spec.num_experts // ep if spec.is_moe else 0
    out = {}
    for name, tensor in state.items():
        parts = _expert(name)
        if parts is None:
            out[name] = tensor
        elif rank * local <= parts[1] < (rank + 1) * local:
            out[f"{parts[0]}{parts[1] - rank * local}.{parts[2]}"] = tensor
    return out


def merge_experts(states: list[dict[str, torch.Tensor]], spec: DecoderSpec) -> dict[str, torch.Tensor]:
    """The inverse of ``expert_state``: every EP rank's tensors (in rank order), experts numbered globally."""
    local = spec.num_experts // len(states) if spec.is_moe else 0
    out = {}
    for rank, state in enumerate(states):
        for name, tensor in state.items():
            parts = _expert(name)
            if parts is None:
                out.setdefault(name, tensor)
            else:
                out[f"{parts[0]}{parts[1] + rank * local}.{parts[2]}"] = tensor
    return out


def check_pp(spec: DecoderSpec, pp: int) -> None:
    """One clear error when ``pp`` cannot split the layers evenly (megatron's default layer split)."""
    if pp < 1 or spec.num_layers % pp:
        raise ValueError(f"train.pp={pp} must divide the model's layers ({spec.num_layers}); pick a pp that divides it")


def _layer(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[2]) if name.startswith("decoder.layers.") else None


def stage_state(state: dict[str, torch.Tensor], spec: DecoderSpec, pp: int, stage: int) -> dict[str, torch.Tensor]:
    """The tensors pipeline stage ``stage`` of ``pp`` holds, its layers numbered from 0 as megatron names them:
    the embedding on the first stage, the final norm and ``output_layer`` on the last (with tied embeddings and
    PP > 1 the last stage keeps its own copy of the embedding as ``output_layer.weight``)."""
    check_pp(spec, pp)
    per_stage = spec.num_layers // pp
    first, last = stage == 0, stage == pp - 1
    out = {}
    for name, tensor in state.items():
        layer = _layer(name)
        if layer is not None:
            if stage * per_stage <= layer < (stage + 1) * per_stage:
                parts = name.split(".")
                out[".".join([*parts[:2], str(layer - stage * per_stage), *parts[3:]])] = tensor
        elif name == "embedding.word_embeddings.weight":
            if first:
                out[name] = tensor
            if last and spec.tied and pp > 1:
                out["output_layer.weight"] = tensor
        elif last:
            out[name] = tensor
    return out


def merge_stages(stages: list[dict[str, torch.Tensor]], spec: DecoderSpec) -> dict[str, torch.Tensor]:
    """The inverse of ``stage_state``: every stage's tensors (in stage order) with global layer numbers."""
    pp = len(stages)
    per_stage = spec.num_layers // pp
    out = {}
    for stage, state in enumerate(stages):
        for name, tensor in state.items():
            layer = _layer(name)
            if layer is not None:
                parts = name.split(".")
                name = ".".join([*parts[:2], str(layer + stage * per_stage), *parts[3:]])
            elif name == "output_layer.weight" and spec.tied:
                continue  # the last stage's copy of the tied embedding
            out[name] = tensor
    return out
