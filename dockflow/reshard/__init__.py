"""Resharding flow: update layout -> generation layout for the actor's weights (MindSpeed RL, Fig. 3 / Fig. 5).

``ParallelLayout`` describes a TP / DP / EP (/ FSDP) layout; ``ModelPartition`` applies per-parameter rules
(``PartitionRules``) to a model's parameters; ``naive_reshard`` and ``allgather_swap`` turn this rank's update
shards into its generation shards over torch.distributed; ``MemoryLedger`` measures device bytes by category;
``eq3_inputs`` / ``predicted_redundant_bytes`` give the paper's Eq. (3); ``megatron_rules`` partitions megatron-core's
GPTModel names over TP and PP. See docs/reshard.md.
"""

from dockflow.reshard.allgather_swap import DEFAULT_BUCKET_BYTES, allgather_swap
from dockflow.reshard.blocks import Block, BlockMap
from dockflow.reshard.gather import ReshardResult
from dockflow.reshard.host_arena import PinnedArena
from dockflow.reshard.layout import ParallelLayout, RankCoords
from dockflow.reshard.ledger import CATEGORIES, UPDATE_STATE, MemoryLedger, Snapshot, storage_bytes
from dockflow.reshard.megatron import MEGATRON_RULES, MEGATRON_VOCAB_MULTIPLE, global_names, megatron_rules
from dockflow.reshard.naive import naive_reshard
from dockflow.reshard.process_groups import ReshardGroups
from dockflow.reshard.redundancy import (
    Eq3Inputs,
    eq3_ep_per_rank,
    eq3_inputs,
    measured_redundant_bytes,
    predicted_redundant_bytes,
    predicted_redundant_bytes_per_rank,
)
from dockflow.reshard.rules import (
    DEFAULT_RULES,
    KINDS,
    ModelPartition,
    ParamMeta,
    PartitionRules,
    StageRules,
    UnknownParameterError,
    param_meta,
    qkv_sections_from_config,
)
from dockflow.reshard.state import UpdateState
from dockflow.reshard.swap import HostSwap

__all__ = [
    "CATEGORIES", "DEFAULT_BUCKET_BYTES", "DEFAULT_RULES", "KINDS", "MEGATRON_RULES", "MEGATRON_VOCAB_MULTIPLE",
    "UPDATE_STATE", "Block", "Eq3Inputs",
    "HostSwap", "MemoryLedger", "ModelPartition", "ParallelLayout", "ParamMeta", "PartitionRules", "PinnedArena",
    "RankCoords",
    "ReshardGroups", "ReshardResult", "BlockMap", "Snapshot", "StageRules", "UnknownParameterError", "UpdateState",
    "allgather_swap", "eq3_ep_per_rank", "eq3_inputs", "global_names", "measured_redundant_bytes", "megatron_rules", "naive_reshard",
    "param_meta",
    "predicted_redundant_bytes", "predicted_redundant_bytes_per_rank", "qkv_sections_from_config",
    "storage_bytes",
]
