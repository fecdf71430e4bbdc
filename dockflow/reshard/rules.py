"""Partition rules: how each parameter of a Qwen2 / Qwen2-MoE / Qwen3-MoE (or megatron-core, ``megatron.py``) model splits over a layout.

A rule is ``regex -> kind`` (first match wins, user overrides first). Kinds:

- ``replicated``: every rank holds the whole tensor (norms, MoE routers, biases of row-parallel layers).
- ``column`` / ``row``: TP split of dim 0 / dim 1 (q/k/v/gate/up, embeddings, lm_head / o_proj, down_proj).
- ``fused_qkv`` / ``fused_gate_up``: a fused projection split per sub-matrix, so TP rank t holds
  ``[q_t; k_t; v_t]`` (or ``[gate_t; up_t]``), not a contiguous chunk of the fused rows.
- ``expert_*``: per-expert names (``...experts.N.gate_proj.weight``): expert N lives on EP rank
  ``N // (E / ep)``, then the column / row / fused-gate-up TP split inside the expert.
- ``stacked_expert_*``: transformers >= 5 stores experts stacked (``mlp.experts.gate_up_proj``, shape
  ``[E, 2I, H]``; ``mlp.experts.down_proj``, ``[E, H, I]``): dim 0 splits over EP, then TP inside.
- ``vocab_column``: a vocabulary-parallel embedding / output layer, padded to a multiple of
  ``layout.vocab_multiple * tp`` rows before the dim-0 split (Megatron's padded vocabulary).
- ``grouped_qkv``: Megatron's ``linear_qkv``, rows ordered by query group, so a TP rank holds a contiguous
  chunk of whole groups (``PartitionRules(query_groups=...)`` must divide by tp).

With pipeline stages (``layout.pp > 1``) ``PartitionRules(stages=StageRules(...))`` says which stage owns
each parameter by name; the partition's names are the global ones (layers numbered over the whole model).

On top, a layout with ``fsdp=True`` chunks each rank's tensor along dim 0 over the ranks that would hold
identical copies (the DP group; the expert-DP group for experts), padded to equal chunks as FSDP2 does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from dockflow.reshard.blocks import BlockMap, assemble, concat, extract
from dockflow.reshard.layout import ParallelLayout


class ParamMeta(NamedTuple):
    """Shape and dtype of one full (unsharded) parameter."""

    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class Kind:
    """How one kind of parameter splits: over experts (``name`` / ``stacked``), over TP (dim), fused sections."""

    expert: str | None = None
    tp_dim: int | None = None
    fused: str | None = None  # "qkv": sections from PartitionRules.qkv_sections; "halves": two equal ones;
    # "groups": whole query groups per rank (PartitionRules.query_groups)
    vocab: bool = False  # dim 0 padded to a multiple of layout.vocab_multiple * tp first


KINDS: dict[str, Kind] = {
    "replicated": Kind(),
    "column": Kind(tp_dim=0),
    "row": Kind(tp_dim=1),
    "fused_qkv": Kind(tp_dim=0, fused="qkv"),
    "fused_gate_up": Kind(tp_dim=0, fused="halves"),
    "expert_column": Kind(expert="name", tp_dim=0),
    "expert_row": Kind(expert="name", tp_dim=1),
    "expert_fused_gate_up": Kind(expert="name", tp_dim=0, fused="halves"),
    "stacked_expert_column": Kind(expert="stacked", tp_dim=1),
    "stacked_expert_row": Kind(expert="stacked", tp_dim=2),
    "stacked_expert_fused_gate_up": Kind(expert="stacked", tp_dim=1, fused="halves"),
    "vocab_column": Kind(tp_dim=0, vocab=True),
    "grouped_qkv": Kind(tp_dim=0, fused="groups"),
}

# Matched with re.search against the full parameter name, in order; the first match wins.
DEFAULT_RULES: tuple[tuple[str, str], ...] = (
    (r"\.experts\.\d+\.(gate_proj|up_proj)\.weight$", "expert_column"),
    (r"\.experts\.\d+\.down_proj\.weight$", "expert_row"),
    (r"\.experts\.\d+\.gate_up_proj\.weight$", "expert_fused_gate_up"),
    (r"\.experts\.gate_up_proj$", "stacked_expert_fused_gate_up"),
    (r"\.experts\.(gate_proj|up_proj)$", "stacked_expert_column"),
    (r"\.experts\.down_proj$", "stacked_expert_row"),
    (r"\.mlp\.gate\.weight$", "replicated"),  # MoE router
    (r"\.shared_expert_gate\.weight$", "replicated"),
    (r"\.qkv_proj\.(weight|bias)$", "fused_qkv"),
    (r"\.gate_up_proj\.weight$", "fused_gate_up"),
    (r"\.(q_proj|k_proj|v_proj)\.(weight|bias)$", "column"),
    (r"\.(gate_proj|up_proj)\.(weight|bias)$", "column"),
    (r"\.(o_proj|down_proj)\.weight$", "row"),
    (r"\.(o_proj|down_proj)\.bias$", "replicated"),
    (r"(^|\.)embed_tokens\.weight$", "column"),  # vocab-parallel embedding
    (r"(^|\.)lm_head\.weight$", "column"),
    (r"norm\.weight$", "replicated"),  # input/post-attention layernorm, q_norm, k_norm, final norm
)

_EXPERT_NAME = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<index>\d+)\.")


class UnknownParameterError(ValueError):
    """No partition rule matches a parameter name."""


@dataclass(frozen=True)
class StageRules:
    """Which pipeline stage owns a parameter, by name, as Megatron's default split does: layer ``i`` (group
    ``layer`` of its regex) of ``num_layers`` on stage ``i // (num_layers / pp)``; names matching ``first`` on
    stage 0, ``last`` on stage pp - 1."""

    num_layers: int
    layer: str = r"(^|\.)layers\.(?P<layer>\d+)\."
    first: str = r"(^|\.)(embedding|embed_tokens)\."
    last: str = r"(^|\.)(final_layernorm|output_layer|norm|lm_head)\."

    def stage_of(self, name: str, pp: int) -> int:
        """The stage of ``name`` over ``pp`` stages; ValueError for an uneven split or a name no pattern matches."""
        if self.num_layers % pp:
            raise ValueError(f"pp={pp} does not divide the model's {self.num_layers} layers; pick a pp that divides it")
        match = re.search(self.layer, name)
        if match is not None:
            layer = int(match["layer"])
            if layer >= self.num_layers:
                raise ValueError(f"parameter {name!r}: layer {layer} is past StageRules.num_layers={self.num_layers}")
            return layer // (self.num_layers // pp)
        if re.search(self.first, name):
            return 0
        if re.search(self.last, name):
            return pp - 1
        raise ValueError(f"parameter {name!r} is in no layer and matches neither StageRules.first {self.first!r} "
                         f"nor .last {self.last!r}; pass StageRules(first=..., last=...) that place it")


class PartitionRules:
    """Ordered ``regex -> kind`` rules; ``overrides`` (e.g. from a config) are tried before the defaults."""

    def __init__(self, overrides: Mapping[str, str] | None = None,
                 rules: Sequence[tuple[str, str]] = DEFAULT_RULES,
                 qkv_sections: Sequence[int] | None = None, query_groups: int | None = None,
                 stages: StageRules | None = None) -> None:
        self.rules: list[tuple[re.Pattern[str], str]] = []
        for pattern, kind in [*(overrides or {}).items(), *rules]:
            if kind not in KINDS:
                raise ValueError(f"partition rule {pattern!r}: unknown kind {kind!r}; expected one of {sorted(KINDS)}")
            try:
                self.rules.append((re.compile(pattern), kind))
            except re.error as err:
                raise ValueError(f"partition rule {pattern!r} is not a valid regex: {err}") from err
        self.qkv_sections = tuple(qkv_sections) if qkv_sections is not None else None
        self.query_groups = query_groups
        self.stages = stages

    def kind_of(self, name: str, shape: Sequence[int] | None = None) -> str:
        """The kind of parameter ``name``; UnknownParameterError says how to add a rule."""
        for pattern, kind in self.rules:
            if pattern.search(name):
                return kind
        shown = f" (shape {tuple(shape)})" if shape is not None else ""
        raise UnknownParameterError(
            f"no partition rule matches parameter {name!r}{shown}; add one with "
            f"PartitionRules(overrides={{{re.escape(name)!r}: KIND}}), KIND one of {sorted(KINDS)}")


def qkv_sections_from_config(config: Any) -> tuple[int, int, int]:
    """Rows of q, k and v in a fused QKV projection, from a transformers config."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads * head_dim, kv_heads * head_dim, kv_heads * head_dim


def param_meta(source: torch.nn.Module | Mapping[str, torch.Tensor]) -> dict[str, ParamMeta]:
    """Name -> (shape, dtype) of a model's parameters (a meta-device model works) or of a state dict."""
    items = source.named_parameters() if isinstance(source, torch.nn.Module) else source.items()
    return {name: ParamMeta(tuple(t.shape), t.dtype) for name, t in items}


class ModelPartition:
    """The rules applied to one model: the kind of every parameter and its shard on any layout and rank."""

    def __init__(self, meta: Mapping[str, ParamMeta], rules: PartitionRules | None = None) -> None:
        self.rules = rules or PartitionRules()
        self.meta = {name: ParamMeta(tuple(m[0]), m[1]) for name, m in meta.items()}
        self.kinds = {name: self.rules.kind_of(name, m.shape) for name, m in self.meta.items()}
        self._experts = self._index_experts()

    def _index_experts(self) -> dict[str, tuple[int, int]]:
        """Per-expert names -> (expert index, number of experts in that layer)."""
        found: dict[str, tuple[str, int]] = {}
        counts: dict[str, set[int]] = {}
        for name, kind in self.kinds.items():
            if KINDS[kind].expert != "name":
                continue
            match = _EXPERT_NAME.match(name)
            if match is None:
                raise ValueError(f"parameter {name!r} has per-expert kind {kind!r} but no '.experts.N.' in its name")
            index = int(match["index"])
            found[name] = (match["prefix"], index)
            counts.setdefault(match["prefix"], set()).add(index)
        for prefix, indices in counts.items():
            if indices != set(range(len(indices))):
                raise ValueError(f"experts under {prefix!r} are not numbered 0..{len(indices) - 1}: {sorted(indices)}")
        return {name: (index, len(counts[prefix])) for name, (prefix, index) in found.items()}

    def kind(self, name: str) -> Kind:
        return KINDS[self.kinds[name]]

    def is_expert(self, name: str) -> bool:
        return self.kind(name).expert is not None

    def holders_kind(self, name: str, layout: ParallelLayout) -> str | None:
        """The layout group kind whose ranks' shards of ``name`` together make one full copy (None: each rank's own)."""
        kind = self.kind(name)
        if layout.pp > 1:
            return "tp_pp" if kind.tp_dim is not None else "pp"
        if layout.fsdp:
            return "stage" if kind.expert or kind.tp_dim is not None else "dp"
        if kind.expert:
            return "tp_ep"
        return "tp" if kind.tp_dim is not None else None

    def shard_map(self, name: str, layout: ParallelLayout, rank: int) -> BlockMap | None:
        """Which part of ``name`` rank ``rank`` holds in ``layout``; None when it holds none (another EP rank's expert)."""
        shape, _ = self.meta[name]
        kind = self.kind(name)
        coords = layout.coords(rank)
        if layout.pp > 1 and self._stage(name, kind, layout) != coords.pp:
            return None
        smap = BlockMap.full(shape)
        if kind.vocab:
            multiple = layout.vocab_multiple * layout.tp
            smap = smap.pad(0, -(-shape[0] // multiple) * multiple)
        if kind.expert == "stacked":
            per = _split_size(name, "experts (dim 0)", shape[0], layout.ep, "ep")
            smap = smap.narrow(0, coords.ep * per, per)
        elif kind.expert == "name":
            index, experts = self._experts[name]
            per = _split_size(name, "experts", experts, layout.ep, "ep")
            if index // per != coords.ep:
                return None
        if kind.tp_dim is not None and layout.tp > 1:
            smap = self._tp_split(name, smap, kind, layout.tp, coords.tp)
        if layout.fsdp:
            degree, index = ((layout.dp // layout.ep, coords.dp // layout.ep) if kind.expert
                             else (layout.dp, coords.dp))
            if degree > 1:
                smap = _fsdp_chunk(smap, degree, index)
        return smap

    def _stage(self, name: str, kind: Kind, layout: ParallelLayout) -> int:
        if layout.fsdp or kind.expert:
            raise ValueError(f"layout {layout}: pipeline stages with FSDP or experts are not supported "
                             f"(parameter {name!r}); use pp=1 there")
        if self.rules.stages is None:
            raise ValueError(f"layout {layout} has pipeline stages: pass PartitionRules(stages=StageRules(num_layers)) "
                             "to say which stage owns each parameter")
        return self.rules.stages.stage_of(name, layout.pp)

    def _tp_split(self, name: str, smap: BlockMap, kind: Kind, tp: int, tp_rank: int) -> BlockMap:
        dim = kind.tp_dim
        assert dim is not None
        size = smap.local_shape[dim]
        if kind.fused == "qkv":
            if self.rules.qkv_sections is None:
                raise ValueError(f"parameter {name!r} is a fused QKV projection: pass PartitionRules(qkv_sections="
                                 "(q_rows, k_rows, v_rows)), e.g. qkv_sections_from_config(model.config)")
            sections = self.rules.qkv_sections
        elif kind.fused == "groups":
            groups = self.rules.query_groups
            if groups is None:
                raise ValueError(f"parameter {name!r} is a grouped QKV projection: pass PartitionRules(query_groups=N), "
                                 "N the model's key/value heads")
            _split_size(name, "query groups", groups, tp, "tp")
            sections = (size,)
        elif kind.fused == "halves":
            if size % 2:
                raise ValueError(f"parameter {name!r}: fused gate_up has an odd size {size} along dim {dim}")
            sections = (size // 2, size // 2)
        else:
            sections = (size,)
        if sum(sections) != size:
            raise ValueError(f"parameter {name!r}: sections {tuple(sections)} do not add up to {size} along dim {dim}")
        parts, offset = [], 0
        for i, section in enumerate(sections):
            what = f"dim {dim} section {i}" if len(sections) > 1 else f"dim {dim}"
            part = _split_size(name, what, section, tp, "tp")
            parts.append(smap.narrow(dim, offset + tp_rank * part, part))
            offset += section
        return concat(parts, dim)

    # -- tensors ------------------------------------------------------------------------------------
    def shard(self, name: str, full: torch.Tensor, layout: ParallelLayout, rank: int) -> torch.Tensor | None:
        """Rank ``rank``'s shard of the full tensor ``full`` of ``name`` (None when it holds none)."""
        if tuple(full.shape) != self.meta[name].shape:
            raise ValueError(f"parameter {name!r}: full tensor of shape {tuple(full.shape)}, expected {self.meta[name].shape}")
        smap = self.shard_map(name, layout, rank)
        return None if smap is None else extract(full, smap)

    def shards(self, full_state: Mapping[str, torch.Tensor], layout: ParallelLayout, rank: int) -> dict[str, torch.Tensor]:
        """Every shard rank ``rank`` holds, name -> tensor (absent: none held)."""
        out = {}
        for name, full in full_state.items():
            shard = self.shard(name, full, layout, rank)
            if shard is not None:
                out[name] = shard
        return out

    def assemble(self, name: str, shards_by_rank: Mapping[int, torch.Tensor], layout: ParallelLayout) -> torch.Tensor:
        """The full tensor of ``name`` from the shards of several ranks (inverse of ``shard``)."""
        pieces = [(smap, t) for r, t in shards_by_rank.items()
                  if (smap := self.shard_map(name, layout, r)) is not None]
        return assemble(self.meta[name].shape, pieces)

    def nbytes(self, name: str) -> int:
        shape, dtype = self.meta[name]
        return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def _split_size(name: str, what: str, size: int, parts: int, field: str) -> int:
    if size % parts:
        raise ValueError(f"parameter {name!r}: {what} = {size} does not split evenly over {field}={parts}")
    return size // parts


def _fsdp_chunk(smap: BlockMap, degree: int, index: int) -> BlockMap:
    """FSDP2's dim-0 chunk: ceil(rows / degree) rows per rank, the last ranks' chunks padded (or all padding)."""
    rows = smap.local_shape[0]
    chunk = -(-rows // degree)
    start = min(index * chunk, rows)
    return smap.narrow(0, start, min(chunk, rows - start)).pad(0, chunk)
