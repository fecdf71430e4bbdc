"""One megatron-core rank as a :class:`TrainingEngine`: the policy split TP x PP (x DP) over the default process
group, each rank a process (as FSDP's ranks are), every rank of a TP x PP model group given the same batch.

- built from a Hugging Face model (or directory): converted (``convert.hf_to_megatron``), sharded for this rank
  (``model.local_shard``) into a ``GPTModel``; the HF module stays as the generation copy (``policy_module``);
- ``infer``: response log-probs through the pipeline schedule, vocab-parallel and a chunk of tokens at a time
  (``vocab_parallel_head``: neither the full vocabulary nor a whole batch's logits exist on a rank), on every rank;
- ``train_mini_batch``: the loss on each micro-batch's log-probs (and the entropy metric) through the schedule, the
  tied / replicated grads reduced (``finalize_grads``) and summed over DP, clipped by the global norm over all
  TP / PP shards (each weight counted once), then torch AdamW over this rank's shards: AdamW is elementwise, so
  the shards' step equals the full model's step of :class:`TorchTrainingEngine`;
- ``generation_weights`` / ``named_weights``: the reshard, by allgather-swap (``dockflow.reshard`` with
  ``megatron_rules``) from this rank's real shards to full weights, HF-named (``megatron_to_hf``) and bound into
  ``generation_model``; the update weights, grads and AdamW state wait on the host meanwhile. Like the FSDP
  engine it rests in the generation state between stage calls and swaps back on ``infer`` /
  ``train_mini_batch``; a :class:`MemoryLedger` records bytes by category (``memory_metrics``);
- checkpoints (``persist.py``): ``save_state`` / ``load_state`` write and read a run checkpoint's parts through
  ``dist_checkpointing`` (each rank its shards, loadable at any TP / PP); ``state_dict`` is layout-free in memory
  (HF names, full tensors, AdamW's moments too), so it loads at any TP / PP as well.

Backend types stay in here; tensors in and out are plain torch tensors in the rollout layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch import nn

from dockflow.engines.interfaces import LossFn, TrainingEngine
from dockflow.engines.logprobs import TokenOutputs, trim_columns
from dockflow.engines.megatron import model as mg
from dockflow.engines.megatron.convert import DecoderSpec, hf_to_megatron, megatron_to_hf, spec_from_hf
from dockflow.engines.megatron.cpu import prepare_megatron
from dockflow.engines.megatron.expert_routing import ROUTED_EXPERTS, ModelRouting, check_routing
from dockflow.engines.megatron.experts import ExpertGroups, megatron_names, partition_rules, reshard_names
from dockflow.engines.megatron.persist import MegatronPersistence
from dockflow.engines.megatron.schedule import (
    ResponseHead,
    finalize_grads,
    pipeline_forward_backward,
    pipeline_response_log_probs,
)
from dockflow.engines.megatron.shard import check_ep
from dockflow.engines.micro_batches import micro_batch_bounds
from dockflow.engines.routing import RoutingStats
from dockflow.engines.swapped_generation import SwappedGeneration
from dockflow.engines.torch_training import load_metrics
from dockflow.reshard import (
    DEFAULT_BUCKET_BYTES,
    MEGATRON_VOCAB_MULTIPLE,
    MemoryLedger,
    ModelPartition,
    ParallelLayout,
    ReshardGroups,
    ReshardResult,
    UpdateState,
    allgather_swap,
    global_names,
    megatron_rules,
    param_meta,
)


def _groups() -> tuple[Any, Any, Any]:
    """(data-parallel, model-parallel (TP x PP), pipeline) process groups of this rank."""
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_group(), ps.get_model_parallel_group(), ps.get_pipeline_model_parallel_group()


class MegatronTrainingEngine(SwappedGeneration, MegatronPersistence, TrainingEngine):
    """This rank's TP / PP shard of the policy, its AdamW state, and the HF generation copy."""

    routing: ModelRouting | None = None  # an MoE policy's routers (``expert_routing.py``); a critic has none
    last_routing: tuple[torch.Tensor, torch.Tensor] | None = None  # (own top-k, used) of the last call

    def __init__(
        self,
        model: nn.Module,
        *,
        tp: int = 1,
        pp: int = 1,
        ep: int = 1,
        lr: float,
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
        infer_batch_size: int = 64,
        temperature: float = 1.0,
        device: str = "cpu",
        seed: int = 0,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        gradient_checkpointing: bool = False,
        max_tokens_per_micro_batch: int | None = None,
        router_replay: bool = False,
        moe_aux_loss_coeff: float = 0.0,
    ):
        """``model``: the Hugging Face causal LM (Qwen2/Qwen2.5, Qwen3 or Llama) every rank starts from; it becomes
        the generation copy. Initialises megatron's TP x PP groups over the default group unless already done.
        ``gradient_checkpointing``: megatron's full activation recompute, every layer (``model.transformer_config``).
        ``max_tokens_per_micro_batch``: micro-batches by tokens (``engines/micro_batches.py``), each its own pass
        through the schedule. ``ep``: expert-parallel ranks of a Qwen3-MoE policy, out of the DP ranks (``experts.py``).
        ``router_replay``: route every forward by the batch's ``routed_experts`` (``expert_routing.py``);
        ``moe_aux_loss_coeff``: the weight of megatron's load-balancing loss in the update (0: none)."""
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        self.spec: DecoderSpec = spec_from_hf(model.config)
        self._check_moe(tp, pp, ep)
        check_routing(self.spec, router_replay, moe_aux_loss_coeff)
        self._init_ranks(tp, pp, seed, device, ep)
        self.model = mg.build_gpt_model(self.spec, tp=tp, pp=pp, recompute=gradient_checkpointing, ep=ep,
                                        routing_replay=router_replay, aux_loss_coeff=moe_aux_loss_coeff).to(self.device)
        if self.spec.is_moe:
            self.routing = ModelRouting(self.model, self.spec.num_experts, self.spec.moe_topk, router_replay,
                                        moe_aux_loss_coeff)
        self.routing_metrics: dict[str, float] = {}  # the last infer's ``moe/routing_mismatch``
        full = hf_to_megatron(model.state_dict(), self.spec)
        mg.load_full_state(self.model, full, self.spec)
        self.partition = (ModelPartition(param_meta(reshard_names(full)), partition_rules(self.spec)) if self.spec.is_moe
                          else ModelPartition(param_meta(full), megatron_rules(self.spec.num_layers, self.spec.num_kv_heads)))
        del full
        for p in model.parameters():  # filled by each reshard
            p.data = torch.empty(0, dtype=p.dtype, device=self.device)
        self.generation_model = model.to(self.device).eval()  # its buffers (RoPE's frequencies) on the device
        self.temperature = temperature
        self._init_training(lr, weight_decay, grad_clip, infer_batch_size)
        self.update_layout = ParallelLayout(tp=tp, pp=pp, dp=self.dp, ep=ep, vocab_multiple=MEGATRON_VOCAB_MULTIPLE)
        self.gen_layout = ParallelLayout(tp=1, dp=dist.get_world_size())  # every rank a full copy for generation
        self.groups = ReshardGroups(self.update_layout)
        self.bucket_bytes = bucket_bytes
        self._to_generation()

    def _check_moe(self, tp: int, pp: int, ep: int) -> None:
        """One line at start for what cannot run with experts: TP > 1 (``shard.check_ep``), PP > 1 (the reshard
        places no expert on a stage), token-budget micro-batches at EP > 1 (each MoE layer is a collective over the
        EP ranks, which must then run the same passes)."""
        check_ep(self.spec, ep, tp)
        if self.spec.is_moe and pp > 1:
            raise ValueError(f"train.pp={pp} with a mixture of experts: the reshard to generation places no experts "
                             "on pipeline stages yet; set train.pp=1")
        if ep > 1 and self.max_tokens_per_micro_batch is not None:
            raise ValueError(f"train.max_tokens_per_micro_batch with train.ep={ep}: the EP ranks' token budgets would "
                             "cut different numbers of passes; set it to null (micro-batches by samples)")

    def _init_ranks(self, tp: int, pp: int, seed: int, device: str, ep: int = 1) -> None:
        """Check the layout against the ranks and initialise megatron's TP x PP (x EP) groups unless already done."""
        if not dist.is_initialized():
            raise RuntimeError(f"{type(self).__name__} needs torch.distributed initialised (the actor's ranks) first")
        world = dist.get_world_size()
        if tp < 1 or pp < 1 or world % (tp * pp):
            raise ValueError(f"train.tp={tp} x train.pp={pp} must divide the actor's {world} ranks; "
                             "pick tp and pp whose product divides them")
        if (world // (tp * pp)) % ep:
            raise ValueError(f"train.ep={ep} must divide the data-parallel ranks ({world // (tp * pp)} of the actor's "
                             f"{world}): the experts are split over DP ranks")
        prepare_megatron(device)  # before megatron is imported (MindSpeed's adaptor on NPU)
        from megatron.core import parallel_state

        if not parallel_state.model_parallel_is_initialized():
            mg.init_model_parallel(tp=tp, pp=pp, seed=seed, device=device, ep=ep)
        elif parallel_state.get_expert_model_parallel_world_size() != ep:
            raise RuntimeError(f"train.ep={ep}: this process's megatron groups were initialised at EP="
                               f"{parallel_state.get_expert_model_parallel_world_size()}; one layout per process")
        self.tp, self.pp, self.dp, self.ep = tp, pp, world // (tp * pp), ep
        self.rank = dist.get_rank()
        self.device = torch.device(device)

    def _init_training(self, lr: float, weight_decay: float, grad_clip: float, infer_batch_size: int) -> None:
        """AdamW over ``self.model``'s shards, the groups, the grad-norm parameters and the memory ledger."""
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate
        from megatron.core.transformer.module import param_is_not_shared

        self.grad_clip = grad_clip
        self.infer_batch_size = infer_batch_size
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        self._dp_group, self._mp_group, self._pp_group = _groups()
        self._pp_last = parallel_state.get_pipeline_model_parallel_last_rank()
        # Each weight once in the global grad norm: TP-replicated ones on TP rank 0 only, the last stage's copy
        # of a tied embedding not at all.
        self._experts = ExpertGroups(self.model)
        self._norm_params = [p for p in self.model.parameters() if param_is_not_shared(p)
                             and param_is_not_tensor_parallel_duplicate(p) and not self._experts.is_expert(p)]
        self.ledger = MemoryLedger(self.device, self.rank)
        # Global layer names share the model's parameter tensors (swapping them swaps the model's).
        self._local_weights = global_names(dict(self.model.named_parameters()), self.spec.num_layers, self.pp,
                                           parallel_state.get_pipeline_model_parallel_rank())
        if self.spec.is_moe:  # experts under their global numbers (``experts.reshard_names``)
            first = parallel_state.get_expert_model_parallel_rank() * (self.spec.num_experts // self.ep)
            self._local_weights = reshard_names(self._local_weights, first)
        self._reshard: ReshardResult | None = None
        self._steps = 0
        self._head: ResponseHead | None = None  # the per-token outputs: log-probs (a critic sets its values)

    @classmethod
    def from_pretrained(cls, path: str | Path, **engine_args: Any) -> MegatronTrainingEngine:
        """The engine over the Hugging Face directory ``path`` (fp32), converted and sharded on load."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
        return cls(model, **engine_args)

    def policy_module(self) -> nn.Module:
        """The HF generation copy: the full weights after each reshard, empty while the engine updates."""
        return self.generation_model

    # -- log-probs and the update (every rank of the layout calls these the same number of times) -----------

    def infer(self, batch: TensorDict) -> torch.Tensor:
        self._to_update()
        self.model.eval()
        width = batch["responses"].shape[1]
        parts = []
        self._routing_start()
        for i in range(0, batch.batch_size[0], self.infer_batch_size):
            rows = slice(i, i + self.infer_batch_size)
            ids, mask = batch["input_ids"][rows], batch["attention_mask"][rows]
            parts.append(pipeline_response_log_probs(
                [self.model], ids.to(self.device), mask.to(self.device), width, self.spec.vocab_size,
                micro_batch_size=ids.shape[0], temperature=self.temperature, head=self._head,
                before=self._routing_pass(batch[rows], width)).cpu())
        self.routing_metrics = self._routing_finish()
        return torch.cat(parts)

    def _routing_start(self, aux_rows: float | None = None) -> None:
        if self.routing is not None:
            self.routing.start(aux_rows)

    def _routing_pass(self, batch: TensorDict, width: int) -> Any:
        """Before each micro-batch's forward of a pass over ``batch``: the MoE routers' targets (None: dense)."""
        if self.routing is None:
            return None
        routed = batch.get(ROUTED_EXPERTS, None)
        return self.routing.batch(None if routed is None else routed.cpu(), batch["attention_mask"].cpu(), width).micro

    def routing_counts(self) -> tuple[int, int]:
        """(mismatched, recorded) (real token, layer) entries of this rank's batches since the last call."""
        return self.routing.take_counts() if self.routing is not None else (0, 0)

    def routing_stats(self) -> RoutingStats:
        return RoutingStats(*self.routing_counts())

    def _routing_finish(self) -> dict[str, float]:
        """Keeps the call's routing (``last_routing``); ``moe/routing_mismatch`` over the DP ranks' entries when the
        batch has the rollout's routing: the share of (real token, layer) whose own top-k set differs from it."""
        if self.routing is None:
            return {}
        own, used, counts = self.routing.finish()
        self.last_routing = (own, used)
        if counts is None:
            return {}
        mismatched, total = self._dp_sum(counts).tolist()
        return {"moe/routing_mismatch": mismatched / max(total, 1.0)}

    def _dp_sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over the DP ranks, on the host (reduced on the device: nccl takes device tensors)."""
        if self.dp > 1:
            values = values.to(self.device)
            dist.all_reduce(values, group=self._dp_group)
        return values.cpu()

    def _from_last_stage(self, obj: Any) -> Any:
        """The last pipeline stage's ``obj`` (a picklable value) on every stage."""
        if self.pp == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self._pp_last, group=self._pp_group)
        return box[0]

    def train_mini_batch(self, batch: TensorDict, loss_fn: LossFn, micro_batch_size: int) -> dict[str, float]:
        """One AdamW step over this DP rank's ``batch`` (its share of the mini-batch), in micro-batches of the
        largest size up to ``micro_batch_size`` that divides it (the pipeline schedule runs equal micro-batches;
        the loss is normalised by the mini-batch's tokens, so the split does not change the step)."""
        self._to_update()
        batch = batch.to(self.device)  # the loss reads the batch's columns next to the log-probs
        rows = batch.batch_size[0]
        micro_batch_size = max(d for d in range(1, min(micro_batch_size, rows) + 1) if rows % d == 0)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        tokens = float(self._dp_sum(batch["response_mask"].sum().to(torch.float64)).clamp(min=1))
        metrics: dict[str, float] = {}

        def micro_loss(outputs: TokenOutputs, rows: slice) -> torch.Tensor:
            micro = batch[rows]
            loss, values = loss_fn(outputs.values, micro, tokens)
            mask = micro["response_mask"]
            share = float(mask.sum()) / tokens  # metrics are token means of the micro-batch
            if outputs.entropy is not None:  # the policy's entropy (a critic has none)
                values = {**values, "train/entropy": float((outputs.entropy * mask).sum() / mask.sum().clamp(min=1))}
            for k, v in values.items():
                metrics[k] = metrics.get(k, 0.0) + v * share
            return loss

        width = batch["responses"].shape[1]
        # Sample micro-batches: one pass of equal micro-batches. Token budgets: a pass per micro-batch (every rank of
        # the model group holds the same batch, so the same cuts); the grads add up in .grad either way.
        passes = [(0, rows, micro_batch_size)] if self.max_tokens_per_micro_batch is None else [
            (lo, hi, hi - lo) for lo, hi in micro_batch_bounds(batch["attention_mask"].sum(-1).tolist(),
                                                               micro_batch_size, self.max_tokens_per_micro_batch)]
        self._routing_start(rows * self.dp)
        for lo, hi, size in passes:
            pipeline_forward_backward(
                [self.model], batch["input_ids"][lo:hi], batch["attention_mask"][lo:hi], width, self.spec.vocab_size,
                micro_batch_size=size, temperature=self.temperature, head=self._head,
                loss_fn=lambda outputs, part, lo=lo: micro_loss(outputs, slice(part.start + lo, part.stop + lo)),
                before=self._routing_pass(batch[lo:hi], width))
        routing_metrics = self._routing_finish()
        finalize_grads(self.model, self.spec)
        if self.dp > 1:  # the loss is a global token mean: DP ranks' grads add up to the full batch's
            self._experts.reduce_grads(list(self.model.parameters()), self._dp_group)
        out = {**self._reduce_metrics(self._from_last_stage(metrics)), **routing_metrics}
        first, keep_r = trim_columns(batch["attention_mask"], width)  # one trim for the whole batch (schedule.py)
        computed = batch.batch_size[0] * (batch["attention_mask"].shape[1] - width - first + keep_r)
        load = torch.tensor([float(computed), float(batch["attention_mask"].sum())])
        out.update(load_metrics(self._rank_loads(load)))
        self._update_state().track(self.ledger)  # the grads exist now
        self.ledger.record(f"step {self._steps} grads", phase="update")
        grad_norm = self._clip_grads()
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._update_state().track(self.ledger)  # the optimizer state exists after the first step
        self.ledger.record(f"step {self._steps} done", phase="update")
        self._steps += 1
        out["grad_norm"] = float(grad_norm)
        return out

    def _reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Each DP rank's metrics are weighted by its share of the global tokens: their sum is the global mean."""
        keys = sorted(metrics)
        values = self._dp_sum(torch.tensor([metrics[k] for k in keys], dtype=torch.float64))
        return dict(zip(keys, values.tolist(), strict=True))

    def _rank_loads(self, load: torch.Tensor) -> torch.Tensor:
        if self.dp == 1:
            return load.unsqueeze(0)
        load = load.to(self.device)
        loads = [torch.zeros_like(load) for _ in range(self.dp)]
        dist.all_gather(loads, load, group=self._dp_group)
        return torch.stack(loads).cpu()

    def _clip_grads(self) -> torch.Tensor:
        """Clip every shard by the global grad norm over the TP x PP model (as ``clip_grad_norm_`` does on the full
        model); returns the norm before clipping. DP ranks hold equal grads by now, so their norms agree."""
        squares = torch.zeros((), dtype=torch.float32, device=self.device)
        for p in self._norm_params:
            if p.grad is not None:
                squares += p.grad.detach().float().pow(2).sum()
        dist.all_reduce(squares, group=self._mp_group)
        if self._experts.expert_params:  # each EP rank's experts are its own
            squares = squares + self._experts.squared_norm(self.device)
        norm = squares.sqrt()
        coef = torch.clamp(self.grad_clip / (norm + 1e-6), max=1.0)
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.mul_(coef)
        return norm

    # -- the update <-> generation cycle (as the FSDP engine's) ---------------------------------------------

    def _update_state(self) -> UpdateState:
        """This rank's shards under global megatron names, their grads and AdamW's state."""
        return UpdateState(self._local_weights, self.optimizer)

    def _to_generation(self) -> None:
        """Reshard (collective): allgather-swap this rank's shards into full HF-named weights bound into
        ``generation_model``; the update state waits on the host."""
        if self._reshard is not None:
            return
        result = allgather_swap(self._update_state(), self.partition, self.update_layout, self.gen_layout,
                                self.groups, bucket_bytes=self.bucket_bytes, ledger=self.ledger,
                                arena=self._host_arena())
        # Fused q/k/v are split into new tensors: the HF dict replaces the megatron one, which frees its buffers.
        hf = megatron_to_hf(megatron_names(result.generation_weights), self.spec)
        result.generation_weights = hf
        self.ledger.track("generation_weights", hf)
        self.ledger.record("hf named", phase="generation")
        params = dict(self.generation_model.named_parameters())
        for name, param in params.items():
            param.data = hf[name]  # a tied lm_head is the embedding's Parameter, bound once
        self._reshard = result

    def _to_update(self) -> None:
        """Swap the update state back and free the generation weights (``generation_model`` is empty after)."""
        result = self._reshard
        if result is None:
            return
        self.ledger.record("end", phase="generation")
        assert result.swap is not None
        result.swap.swap_back()
        for p in self.generation_model.parameters():
            p.data = torch.empty(0, dtype=p.dtype, device=self.device)
        result.release_generation(self.ledger)
        self._reshard = None
        self._update_state().track(self.ledger)
        self.ledger.record("swapped back", phase="update")
