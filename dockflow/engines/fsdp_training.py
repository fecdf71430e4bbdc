"""Data-parallel training with FSDP2 (ZeRO-3 sharding), and the actor's update <-> generation cycle.

The DP >= 2 backend of :class:`TrainingEngine`. Every rank of the default process group holds 1/W of each
weight, grad and AdamW state (``fully_shard`` per decoder layer, then at the root) and runs the micro-batch loop
of :class:`TorchTrainingEngine` on its own, equal share of each mini-batch. The loss is normalised by the token
count of the whole mini-batch (all ranks) and the grads are summed over ranks, so one step equals the DP=1 step
on the union of the shares.

Generation never runs on the FSDP module (ranks stopping at EOS after different steps would desynchronise its
collectives): it runs on ``generation_model``, a plain copy whose weights come from allgather-swap
(``dockflow.reshard``). The engine moves between two states, lazily:

- generation: ``generation_weights()`` allgathers the shards into full weights bound into ``generation_model``
  and swaps the update weights, grads and optimizer state to host (nothing of them stays on the device);
- update: ``infer`` / ``train_mini_batch`` first swap the update state back and free the generation weights.

Between stage calls the engine rests in the generation state (after construction, a reshard, a load);
``state_dict`` keeps it there. A :class:`MemoryLedger` records bytes by category at each step.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.utils._pytree import tree_map_only

from dockflow.engines.interfaces import LossFn
from dockflow.engines.lora import (
    check_adapters,
    is_lora,
    lora_partition_rules,
    trainable_names,
    trainable_state,
)
from dockflow.engines.swapped_generation import SwappedGeneration
from dockflow.engines.torch_training import TorchTrainingEngine
from dockflow.reshard import (
    DEFAULT_BUCKET_BYTES,
    MemoryLedger,
    ModelPartition,
    ParallelLayout,
    PartitionRules,
    ReshardGroups,
    ReshardResult,
    UpdateState,
    allgather_swap,
    param_meta,
)
from dockflow.reshard.state import local_tensor

FULL_STATE = StateDictOptions(full_state_dict=True, cpu_offload=True)
ADAPTER_STATE = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)  # LoRA


def shard_model(model: nn.Module) -> nn.Module:
    """FSDP2 over the default process group: each decoder layer one unit, the rest (embeddings, norm, head) the
    root's. Grads are summed over ranks (divide factor 1), not averaged: the loss is already a global mean."""
    for module in model.modules():
        if type(module).__name__.endswith("DecoderLayer"):
            fully_shard(module)
    fully_shard(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no PREMUL_SUM / AVG)
    return model


def empty_copy(model: nn.Module) -> nn.Module:
    """A plain copy of ``model`` (buffers, config, generation config) whose parameters hold no memory yet."""
    twin = copy.deepcopy(model)
    for p in twin.parameters():
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)
    return twin.eval()


def full_value(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (e.g. a replicated grad norm), else the tensor itself."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


class FSDPTrainingEngine(SwappedGeneration, TorchTrainingEngine):
    """This rank's FSDP2 shard of the policy, its AdamW state, and the plain generation copy."""

    def __init__(
        self,
        model: nn.Module,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        partition_rules: PartitionRules | None = None,
        **engine_args: Any,
    ):
        """``engine_args``: those of :class:`TorchTrainingEngine` (lr, weight_decay, grad_clip, ...)."""
        if not dist.is_initialized():
            raise RuntimeError("FSDPTrainingEngine needs torch.distributed initialised (the actor's DP group) first")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if partition_rules is None and is_lora(model):  # PEFT's names: q_proj.base_layer.weight, lora_A, lora_B
            partition_rules = lora_partition_rules()
        self.partition = ModelPartition(param_meta(model), partition_rules)  # full shapes, before sharding
        self.generation_model = empty_copy(model).to(engine_args.get("device", "cpu"))
        super().__init__(model, **engine_args)
        self._local_weights = {name: local_tensor(p) for name, p in self.model.named_parameters()}
        self.update_layout = ParallelLayout(tp=1, dp=self.world, fsdp=True)
        self.gen_layout = ParallelLayout(tp=1, dp=self.world)  # every rank a full copy for generation
        self.groups = ReshardGroups(self.update_layout)
        self.bucket_bytes = bucket_bytes
        self.ledger = MemoryLedger(self.device, self.rank)
        self._reshard: ReshardResult | None = None
        self._steps = 0
        self._to_generation()

    def policy_module(self) -> nn.Module:
        """The plain generation copy: the full weights after each reshard (``self.model`` is this rank's shard)."""
        return self.generation_model

    # -- the update <-> generation cycle ------------------------------------------------------------------

    def _update_state(self) -> UpdateState:
        """Weights as this rank's local shards, held by the engine: a sharded Parameter's ``to_local`` is a new view
        each call, which the ledger's weak references would lose at once. Grads and optimizer state as they are."""
        grads = {name: p.grad for name, p in self.model.named_parameters()}
        return UpdateState(self._local_weights, self.optimizer, grads=grads)

    def _to_generation(self) -> None:
        """Reshard (collective): gather full weights into ``generation_model``, swap the update state out."""
        if self._reshard is not None:
            return
        result = allgather_swap(self._update_state(), self.partition, self.update_layout, self.gen_layout,
                                self.groups, bucket_bytes=self.bucket_bytes, ledger=self.ledger,
                                arena=self._host_arena())
        params = dict(self.generation_model.named_parameters())
        for name, weight in result.generation_weights.items():
            params[name].data = weight  # by reference: tied weights share one Parameter, so they follow
        self._reshard = result

    def _to_update(self) -> None:
        """Swap the update state back and free the generation weights (``generation_model`` is empty after)."""
        result = self._reshard
        if result is None:
            return
        self.ledger.record("end", phase="generation")
        assert result.swap is not None
        result.swap.swap_back()
        for weight in result.generation_weights.values():
            weight.untyped_storage().resize_(0)  # generation_model shares these storages
        result.release_generation(self.ledger)
        self._reshard = None
        self._update_state().track(self.ledger)
        self.ledger.record("swapped back", phase="update")

    # -- training (every rank calls these the same number of times) ---------------------------------------

    def _wrap(self, model: nn.Module) -> nn.Module:
        return shard_model(model)

    def _total_tokens(self, batch: TensorDict) -> float:
        tokens = batch["response_mask"].sum().to(self.device, torch.float64)  # nccl reduces device tensors only
        dist.all_reduce(tokens)
        return float(tokens.clamp(min=1))

    def _reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Each rank's metrics are weighted by its share of the global tokens: their sum is the global mean."""
        keys = sorted(metrics)
        values = torch.tensor([metrics[k] for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(values)
        return dict(zip(keys, values.tolist(), strict=True))

    def _micro_batches(self, batch: TensorDict, micro_batch_size: int) -> list[tuple[int, int]]:
        """Every rank runs as many micro-batches as the rank with the most (FSDP's collectives pair up): token
        budgets may cut the ranks' shares into different counts; the short ranks add empty ones."""
        bounds = super()._micro_batches(batch, micro_batch_size)
        count = torch.tensor([len(bounds)], device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        end = bounds[-1][1] if bounds else 0
        return bounds + [(end, end)] * (int(count) - len(bounds))

    def _agree(self, pack: bool) -> bool:
        """Pack only where every rank would (the ranks call the model the same number of times: FSDP's all-gathers
        pair up)."""
        vote = torch.tensor([int(pack)], device=self.device)
        dist.all_reduce(vote, op=dist.ReduceOp.MIN)
        return bool(vote)

    def _rank_loads(self, load: torch.Tensor) -> torch.Tensor:
        load = load.to(self.device)
        loads = [torch.zeros_like(load) for _ in range(dist.get_world_size())]
        dist.all_gather(loads, load)
        return torch.stack(loads).cpu()

    def _clip_grads(self) -> torch.Tensor:
        self._update_state().track(self.ledger)  # the grads exist now
        self.ledger.record(f"step {self._steps} grads", phase="update")
        return full_value(super()._clip_grads())

    def train_mini_batch(self, batch: TensorDict, loss_fn: LossFn, micro_batch_size: int) -> dict[str, float]:
        self._to_update()
        out = super().train_mini_batch(batch, loss_fn, micro_batch_size)
        self._update_state().track(self.ledger)  # the optimizer state exists after the first step
        self.ledger.record(f"step {self._steps} done", phase="update")
        self._steps += 1
        return out

    def infer(self, batch: TensorDict) -> torch.Tensor:
        self._to_update()
        return super().infer(batch)

    # -- checkpoints: full (unsharded) state dicts, the same model keys as DP=1 --------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Full model (LoRA: the adapters only) and optimizer state (collective); complete on rank 0, empty on the
        other ranks."""
        with self._update_on_device():
            model = get_model_state_dict(self.model, options=ADAPTER_STATE if self.lora else FULL_STATE)
            if self.lora:  # ignore_frozen_params keeps a tied weight's second name (lm_head.weight)
                model = trainable_state(model, trainable_names(self.model))
            state = {
                "model": model,
                "optimizer": get_optimizer_state_dict(self.model, self.optimizer, options=FULL_STATE),
            }
            # Unsharded values (AdamW's step count) come back as the live tensors, which the swap-out would empty.
            return tree_map_only(torch.Tensor, torch.clone, state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Every rank loads the full state and keeps its shard; then reshards for generation (collective)."""
        self._to_update()
        options = StateDictOptions(full_state_dict=True)
        if self.lora:  # the adapters only: the frozen base is the run's initial model
            check_adapters(self.model, state["model"])
        model_options = StateDictOptions(full_state_dict=True, strict=not self.lora)
        set_model_state_dict(self.model, state["model"], options=model_options)
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=options)
        for values in self.optimizer.state.values():  # AdamW's step counts arrive in storages that cannot be swapped
            for key, value in values.items():
                if isinstance(value, torch.Tensor) and not value.untyped_storage().resizable():
                    values[key] = value.clone()
        self._to_generation()
