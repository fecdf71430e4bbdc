"""Partition rules for megatron-core's ``GPTModel`` names (local layer spec), and its stage-local layer names.

The names are those of ``dockflow.engines.megatron.convert``'s full megatron state, read here only as patterns
(reshard imports nothing of the engines). Megatron splits them like this (``partition_dim`` of each parameter):

- ``linear_qkv`` (weight, bias): rows ordered per query group ([q heads of the group; k; v]), so a TP rank
  holds a contiguous chunk of whole groups: kind ``grouped_qkv``;
- ``linear_fc1``: ``[gate; up]``, each half split over TP and stacked again per rank: ``fused_gate_up``;
- ``linear_proj``, ``linear_fc2``: row-parallel, dim 1: ``row``;
- the word embedding and ``output_layer``: vocabulary-parallel, padded to a multiple of 128 x TP rows with
  zeros (``ParallelLayout(vocab_multiple=128)``; a generation layout with the default 1 holds the unpadded
  vocabulary): ``vocab_column``;
- the norms (input, pre-MLP, q / k, final): ``replicated``.

Pipeline stages own layers by their global number (``StageRules``): the embedding on the first stage, the final
norm and ``output_layer`` on the last. A rank's model numbers its layers from 0 (``global_names`` renumbers).
With tied embeddings and PP > 1 the last stage holds its own copy of the embedding as ``output_layer.weight``;
the full state has no such name, so that copy is not resharded (generation reads the embedding).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from dockflow.reshard.rules import PartitionRules, StageRules

MEGATRON_RULES: tuple[tuple[str, str], ...] = (
    (r"\.self_attention\.linear_qkv\.(weight|bias)$", "grouped_qkv"),
    (r"\.self_attention\.linear_proj\.weight$", "row"),
    (r"\.mlp\.linear_fc1\.weight$", "fused_gate_up"),
    (r"\.mlp\.linear_fc2\.weight$", "row"),
    (r"^embedding\.word_embeddings\.weight$", "vocab_column"),
    (r"^output_layer\.weight$", "vocab_column"),
    (r"layernorm\.weight$", "replicated"),  # input / pre_mlp / q / k / final layernorm
)
MEGATRON_STAGES = {"layer": r"^decoder\.layers\.(?P<layer>\d+)\.", "first": r"^embedding\.",
                   "last": r"^(decoder\.final_layernorm|output_layer)\."}
MEGATRON_VOCAB_MULTIPLE = 128  # Megatron-LM's --make-vocab-size-divisible-by default
_LAYER = re.compile(MEGATRON_STAGES["layer"])


def megatron_rules(num_layers: int, query_groups: int) -> PartitionRules:
    """The rules of a megatron ``GPTModel`` with ``num_layers`` layers and ``query_groups`` key/value heads."""
    return PartitionRules(rules=MEGATRON_RULES, query_groups=query_groups,
                          stages=StageRules(num_layers, **MEGATRON_STAGES))


def global_names(local: Mapping[str, torch.Tensor], num_layers: int, pp: int, stage: int) -> dict[str, torch.Tensor]:
    """A stage's tensors (layers numbered from 0, as its model names them) under the full model's names."""
    if num_layers % pp:
        raise ValueError(f"pp={pp} does not divide the model's {num_layers} layers; pick a pp that divides it")
    offset = stage * (num_layers // pp)

    def rename(name: str) -> str:
        match = _LAYER.match(name)
        if match is None:
            return name
        return f"decoder.layers.{int(match['layer']) + offset}.{name[match.end():]}"

    return {rename(name): tensor for name, tensor in local.items()}
