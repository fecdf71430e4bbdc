"""A megatron-core ``GPTModel`` for a ``DecoderSpec``, the rank's set-up, its weights and its log-probs.

Everything here runs inside one rank's process after ``torch.distributed`` is initialised; megatron is imported
only in the functions (after ``cpu.prepare_megatron``, which must come first on NPU).
"""

from __future__ import annotations

from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F

from dockflow.engines.logprobs import trim_columns
from dockflow.engines.megatron.convert import DecoderSpec
from dockflow.engines.megatron.cpu import prepare_megatron
from dockflow.engines.megatron.shard import (
    check_ep,
    expert_state,
    merge_experts,
    merge_shards,
    merge_stages,
    padded_vocab_size,
    shard_state,
    stage_state,
)
from dockflow.engines.megatron.vocab_parallel_head import response_outputs

# megatron's fused kernels (Apex / Transformer Engine) are absent on CPU; the unfused paths are exact in fp32.
_UNFUSED = dict(bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
                bias_dropout_fusion=False, gradient_accumulation_fusion=False, apply_rope_fusion=False)


def init_model_parallel(tp: int, pp: int, seed: int, device: str = "cpu", ep: int = 1) -> list[str]:
    """Prepare the process for ``device``, split the world into TP x PP (x DP) groups, EP groups out of DP (experts
    not split by TP), and seed megatron's RNG tracker; returns what ``prepare_megatron`` applied."""
    applied = prepare_megatron(device)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    experts = dict(expert_model_parallel_size=ep, expert_tensor_parallel_size=1) if ep > 1 else {}
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                             **experts)
    model_parallel_cuda_manual_seed(seed)
    return applied


def destroy_model_parallel() -> None:
    """Forget megatron's process groups (a rank can then initialise another layout)."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()


def moe_config(spec: DecoderSpec, ep: int = 1, aux_loss_coeff: float = 0.0) -> dict[str, Any]:
    """The ``TransformerConfig`` fields of an MoE ``spec`` (none for a dense one): Qwen3-MoE's softmax router, top-k
    renormalised (``norm_topk_prob``: softmax over the top-k logits, megatron's ``moe_router_pre_softmax=False``) or
    not (softmax over all, then top-k); the load-balancing loss (megatron's ``aux_loss``, switch-transformer style)
    when ``aux_loss_coeff`` > 0, else none; the all-to-all dispatcher (it takes ranks with unequal token counts,
    which the all-gather one does not); experts split by EP only."""
    if not spec.is_moe:
        return {}
    return dict(num_moe_experts=spec.num_experts, moe_ffn_hidden_size=spec.moe_ffn_hidden_size,
                moe_router_topk=spec.moe_topk, moe_router_pre_softmax=not spec.norm_topk_prob,
                moe_router_load_balancing_type="aux_loss" if aux_loss_coeff > 0 else "none",
                moe_aux_loss_coeff=aux_loss_coeff, moe_token_dispatcher_type="alltoall",
                expert_model_parallel_size=ep, expert_tensor_parallel_size=1)


def transformer_config(spec: DecoderSpec, tp: int = 1, pp: int = 1, dtype: torch.dtype = torch.float32, *,
                       recompute: bool = False, ep: int = 1, routing_replay: bool = False,
                       aux_loss_coeff: float = 0.0) -> Any:
    """megatron's ``TransformerConfig`` for ``spec``: RMSNorm, SwiGLU, GQA, no linear biases but q/k/v's, MoE fields
    (``moe_config``); with ``recompute`` every layer's activations are recomputed in the backward pass (full
    recompute, one layer a unit)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    full = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1) if recompute else {}
    return TransformerConfig(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_heads,
        num_query_groups=spec.num_kv_heads,
        kv_channels=spec.head_dim,
        ffn_hidden_size=spec.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=spec.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=spec.qkv_bias,
        qk_layernorm=spec.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        use_cpu_initialization=True,
        batch_p2p_sync=False,  # True calls torch.cuda.synchronize around every p2p exchange
        calculate_per_token_loss=True,  # the schedule leaves the loss as given (the recipes normalise it)
        **full,
        **moe_config(spec, ep, aux_loss_coeff),
        **(dict(moe_enable_routing_replay=True) if routing_replay else {}),
        **_UNFUSED,
    )


def _final_hidden(self: Any, hidden_states: torch.Tensor, **_: Any) -> torch.Tensor:
    """``GPTModel._postprocess`` of a model whose logits are formed outside it: the final hidden states [S, B, H]."""
    return hidden_states


def build_gpt_model(spec: DecoderSpec, tp: int = 1, pp: int = 1, vocab_divisible_by: int = 128, *,
                    recompute: bool = False, ep: int = 1, routing_replay: bool = False,
                    aux_loss_coeff: float = 0.0) -> Any:
    """This rank's ``GPTModel`` (local layer spec, RoPE, padded vocabulary); needs ``init_model_parallel``. Its last
    stage returns the final hidden states [S, B, H] (after the final norm), not the logits: the output layer's
    weight is applied by the caller, a chunk of tokens at a time (``vocab_parallel_head``), or the critic's head.
    ``recompute``: full activation recompute (``transformer_config``). ``ep``: expert-parallel ranks (MoE).
    ``routing_replay``: megatron's ``moe_enable_routing_replay`` (a ``RouterReplay`` per router; ``expert_routing.py``).
    ``aux_loss_coeff``: the load-balancing loss's weight (``moe_config``; ``expert_routing.py`` scales it per micro-batch)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    check_ep(spec, ep, tp)
    layer_spec = get_gpt_layer_local_spec(num_experts=spec.num_experts or None, moe_grouped_gemm=False,
                                          qk_layernorm=spec.qk_norm, normalization="RMSNorm")
    model = GPTModel(
        config=transformer_config(spec, tp, pp, recompute=recompute, ep=ep, routing_replay=routing_replay,
                                  aux_loss_coeff=aux_loss_coeff),
        transformer_layer_spec=layer_spec,
        vocab_size=padded_vocab_size(spec.vocab_size, tp, vocab_divisible_by),
        max_sequence_length=spec.max_positions,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        position_embedding_type="rope",
        rotary_base=int(spec.rope_theta),
        share_embeddings_and_output_weights=spec.tied,
    )
    model._postprocess = MethodType(_final_hidden, model)  # no multi-token prediction here: nothing else is skipped
    return model


def _tp() -> tuple[int, int]:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_world_size(), parallel_state.get_tensor_model_parallel_rank()


def _pp() -> tuple[int, int]:
    from megatron.core import parallel_state

    return parallel_state.get_pipeline_model_parallel_world_size(), parallel_state.get_pipeline_model_parallel_rank()


def _ep() -> tuple[int, int]:
    from megatron.core import parallel_state

    return parallel_state.get_expert_model_parallel_world_size(), parallel_state.get_expert_model_parallel_rank()


def local_shard(full: dict[str, torch.Tensor], spec: DecoderSpec, vocab_divisible_by: int = 128) -> dict[str, torch.Tensor]:
    """This rank's TP shard of its pipeline stage's part of a full megatron state (``convert.hf_to_megatron``), its
    EP rank's experts, named like the rank's model parameters: the inverse of ``gather_full``."""
    (tp, tp_rank), (pp, stage), (ep, ep_rank) = _tp(), _pp(), _ep()
    state = stage_state(shard_state(full, spec, tp, tp_rank, vocab_divisible_by), spec, pp, stage)
    return expert_state(state, spec, ep, ep_rank)


def load_full_state(model: Any, full: dict[str, torch.Tensor], spec: DecoderSpec, vocab_divisible_by: int = 128) -> None:
    """Copy this rank's shard of a full megatron state (``local_shard``) into ``model``."""
    shard = local_shard(full, spec, vocab_divisible_by)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(shard))
    if missing:
        raise KeyError(f"megatron weights: the converted state lacks {missing[:3]}; does the spec match the model?")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(shard[name])


def gather_full(local: dict[str, torch.Tensor], spec: DecoderSpec) -> dict[str, torch.Tensor]:
    """Full tensors (vocabulary unpadded, global layer and expert numbers) from every rank's ``local`` tensors named
    like its model's parameters (the parameters themselves, or their gradients), on every rank. TP shards are
    all-gathered; the experts' and the stages' parts travel as objects (small models; the reshard path streams
    real ones)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    tp, _ = _tp()
    group = parallel_state.get_tensor_model_parallel_group()
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(tp)]
    for name, tensor in local.items():
        parts = [torch.empty_like(tensor) for _ in range(tp)]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        for r in range(tp):
            shards[r][name] = parts[r]
    stage = merge_shards(shards, spec)
    ep, _ = _ep()
    if ep > 1:  # each EP rank's experts, as objects (small models, as the stages below)
        parts: list[Any] = [None] * ep
        dist.all_gather_object(parts, stage, group=parallel_state.get_expert_model_parallel_group())
        stage = merge_experts(parts, spec)
    pp, _ = _pp()
    if pp == 1:
        return stage
    stages: list[Any] = [None] * pp
    dist.all_gather_object(stages, stage, group=parallel_state.get_pipeline_model_parallel_group())
    return merge_stages(stages, spec)


def gather_full_state(model: Any, spec: DecoderSpec) -> dict[str, torch.Tensor]:
    """The full megatron state from every TP rank's parameters (``gather_full``)."""
    return gather_full({n: p.detach() for n, p in model.named_parameters()}, spec)


def attention_mask_for(mask: torch.Tensor) -> torch.Tensor:
    """megatron's boolean mask [B, 1, S, S] (True = not attended) from a [B, S] padding mask, causal."""
    seq = mask.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=mask.device).tril()
    keep = causal[None] & mask.bool()[:, None, :]
    return ~keep[:, None]


def trimmed_rollout(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int):
    """(ids, mask, kept response columns) with the batch's all-padding columns cut off."""
    first, keep_r = trim_columns(attention_mask, response_width)
    end = input_ids.shape[1] - response_width + keep_r
    return input_ids[:, first:end], attention_mask[:, first:end], keep_r


def forward_rollout(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One stage's forward: hidden states [S, B, H] (the final ones, normed, on the last stage)."""
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # RoPE is relative: megatron's own positions agree
    return model(ids, positions, attention_mask_for(mask))


def response_log_probs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int, vocab_size: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-prob of each response token [B, R] in the rollout layout (``dockflow.engines.interfaces``), as
    ``dockflow.engines.logprobs.response_log_probs`` computes it with a Hugging Face model (PP=1)."""
    ids, mask, keep_r = trimmed_rollout(input_ids, attention_mask, response_width)
    logp = response_outputs(model, forward_rollout(model, ids, mask), ids, keep_r, vocab_size,
                            temperature=temperature).values
    return F.pad(logp, (0, response_width - keep_r))
