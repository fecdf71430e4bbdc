"""What the megatron engine adds for a mixture of experts at EP > 1: the reshard's names and rules for the router
and the experts, the expert-data-parallel grad reduction, and the grad norm over every EP rank's experts.

The reshard (``dockflow.reshard``) finds an expert's number in ``.experts.N.``; megatron names a rank's experts
``mlp.experts.local_experts.{j}`` (numbered from 0 on each EP rank). The update state and the partition use
``mlp.experts.{e}`` with the global number ``e = ep_rank * E / ep + j`` (``reshard_names``); the generation weights
come back under those names and ``megatron_names`` gives the full megatron state's names for ``megatron_to_hf``.
Experts are not split by TP (expert TP size 1), so their kinds' TP split never applies (MoE trains at TP = 1).
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.distributed as dist

from dockflow.engines.megatron.convert import EXPERT, DecoderSpec
from dockflow.reshard import MEGATRON_RULES, PartitionRules, StageRules
from dockflow.reshard.megatron import MEGATRON_STAGES

RESHARD_EXPERT = "mlp.experts."
MOE_RULES: tuple[tuple[str, str], ...] = (
    (r"\.mlp\.router\.weight$", "replicated"),
    (r"\.mlp\.experts\.\d+\.linear_fc1\.weight$", "expert_fused_gate_up"),
    (r"\.mlp\.experts\.\d+\.linear_fc2\.weight$", "expert_row"),
)
_LOCAL = re.compile(re.escape(EXPERT) + r"(?P<index>\d+)\.")
_GLOBAL = re.compile(re.escape(RESHARD_EXPERT) + r"(?P<index>\d+)\.")


def partition_rules(spec: DecoderSpec) -> PartitionRules:
    """megatron's partition rules (``reshard.megatron_rules``) with the router's and the experts'."""
    return PartitionRules(rules=(*MEGATRON_RULES, *MOE_RULES), query_groups=spec.num_kv_heads,
                          stages=StageRules(spec.num_layers, **MEGATRON_STAGES))


def reshard_names(state: dict[str, Any], offset: int = 0) -> dict[str, Any]:
    """``local_experts.{j}`` -> ``experts.{offset + j}``: a full state (offset 0) or an EP rank's (its first expert)."""
    return {_LOCAL.sub(lambda m: f"{RESHARD_EXPERT}{int(m['index']) + offset}.", name): t for name, t in state.items()}


def megatron_names(state: dict[str, Any]) -> dict[str, Any]:
    """The inverse of ``reshard_names`` on a full state: ``experts.{e}`` -> ``local_experts.{e}``."""
    return {_GLOBAL.sub(lambda m: f"{EXPERT}{m['index']}.", name): t for name, t in state.items()}


def is_expert(name: str) -> bool:
    return EXPERT in name


class ExpertGroups:
    """This rank's expert-data-parallel group (expert grads are summed there, dense ones over DP) and the group over
    which the experts' squared grads add up to the model's (EP x PP)."""

    def __init__(self, model: Any):
        from megatron.core import parallel_state as ps

        self.expert_params = [p for n, p in model.named_parameters() if is_expert(n)]
        self._ids = {id(p) for p in self.expert_params}
        self.data_parallel = ps.get_expert_data_parallel_group()
        self.model_parallel = ps.get_expert_tensor_model_pipeline_parallel_group()

    def is_expert(self, param: torch.Tensor) -> bool:
        return id(param) in self._ids

    def reduce_grads(self, params: list[torch.Tensor], dp_group: Any) -> None:
        """Sum each grad over its data-parallel ranks: the experts' over expert-DP, the rest over DP."""
        for param in params:
            if param.grad is None:
                continue
            group = self.data_parallel if self.is_expert(param) else dp_group
            if dist.get_world_size(group) > 1:
                dist.all_reduce(param.grad, group=group)

    def squared_norm(self, device: torch.device) -> torch.Tensor:
        """The experts' squared grad norm summed over every EP rank (and stage)."""
        squares = torch.zeros((), dtype=torch.float32, device=device)
        for param in self.expert_params:
            if param.grad is not None:
                squares += param.grad.detach().float().pow(2).sum()
        dist.all_reduce(squares, group=self.model_parallel)
        return squares
