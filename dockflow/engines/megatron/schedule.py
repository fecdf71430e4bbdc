"""Micro-batches of the rollout layout through megatron's pipeline schedule (``get_forward_backward_func``, any
PP): forward-only log-probs, a forward-backward with a loss on the log-probs (and the entropy), and the gradient
reductions megatron's DDP wrapper would do (``finalize_grads``). Runs inside a rank after
``model.init_model_parallel``. The last stage's model returns its final hidden states; a ``ResponseHead`` maps the
response positions' to per-token outputs (by default the log-probs and entropy, vocab-parallel and chunked:
``vocab_parallel_head``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from dockflow.engines.logprobs import TokenOutputs
from dockflow.engines.megatron.convert import DecoderSpec
from dockflow.engines.megatron.model import forward_rollout, trimmed_rollout
from dockflow.engines.megatron.vocab_parallel_head import response_outputs
from dockflow.engines.token_head import DEFAULT_CHUNK

# (the micro-batch's outputs, values and entropy [b, R], of those rows of the batch) -> the micro-batch's loss
MicroLoss = Callable[[TokenOutputs, slice], torch.Tensor]
# (the stage's model, its final hidden states [s, b, H], the micro-batch's trimmed ids, kept response columns) ->
# the per-token outputs [b, kept] (log-probs and entropy by default; a value model's values, ``value.response_values``)
ResponseHead = Callable[[Any, torch.Tensor, torch.Tensor, int], TokenOutputs]


def policy_head(vocab_size: int, temperature: float = 1.0, chunk: int = DEFAULT_CHUNK) -> ResponseHead:
    """The policy's head: log-probs and entropy at ``temperature``, ``chunk`` tokens at a time."""
    return lambda model, hidden, ids, keep_r: response_outputs(model, hidden, ids, keep_r, vocab_size,
                                                               temperature=temperature, chunk=chunk)


def _head_or_logp(head: ResponseHead | None, vocab_size: int, temperature: float) -> ResponseHead:
    return policy_head(vocab_size, temperature) if head is None else head


def _micro_batches(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int, size: int):
    """([(rows, ids, mask)] per micro-batch, kept response columns, trimmed sequence length)."""
    batch = input_ids.shape[0]
    if size < 1 or batch % size:
        raise ValueError(f"megatron micro-batches: micro_batch_size={size} must divide the batch ({batch} rows)")
    ids, mask, keep_r = trimmed_rollout(input_ids, attention_mask, response_width)
    micro = [(slice(i, i + size), ids[i : i + size], mask[i : i + size]) for i in range(0, batch, size)]
    return micro, keep_r, ids.shape[1]


# called with a micro-batch's rows before its forward (``routing.BatchRouting.micro``: the MoE routers' targets)
BeforeForward = Callable[[slice], None]


def _run(model: Any, micro: list, seq: int, forward_only: bool, to_output: Callable,
         before: BeforeForward | None = None) -> list[Any]:
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def step(data: Any, stage_model: Any):
        rows, micro_ids, micro_mask = next(data)
        if before is not None:
            before(rows)
        return (forward_rollout(stage_model, micro_ids, micro_mask),
                lambda out, **_: to_output(stage_model, out, rows, micro_ids))

    return get_forward_backward_func()(
        forward_step_func=step, data_iterator=iter(micro), model=model, num_microbatches=len(micro),
        seq_length=seq, micro_batch_size=micro[0][1].shape[0], forward_only=forward_only,
        collect_non_loss_data=forward_only,
    )


def _from_last_stage(tensor: torch.Tensor) -> torch.Tensor:
    """The last pipeline stage's ``tensor`` on every stage (the others pass one of the same shape)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        dist.broadcast(tensor, src=parallel_state.get_pipeline_model_parallel_last_rank(),
                       group=parallel_state.get_pipeline_model_parallel_group())
    return tensor


def pipeline_response_log_probs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int, vocab_size: int,
    *, micro_batch_size: int, temperature: float = 1.0, head: ResponseHead | None = None,
    before: BeforeForward | None = None,
) -> torch.Tensor:
    """``model.response_log_probs`` through the schedule (forward only) in micro-batches of ``micro_batch_size``
    rows (or ``head``'s outputs, e.g. a value model's values); the last stage computes them and every stage of the
    pipeline receives them. ``before``: called with each micro-batch's rows before its forward."""
    from megatron.core import parallel_state

    head = _head_or_logp(head, vocab_size, temperature)
    micro, keep_r, seq = _micro_batches(input_ids, attention_mask, response_width, micro_batch_size)
    with torch.no_grad():
        outputs = _run(model, micro, seq, True, lambda stage, out, rows, ids: head(stage, out, ids, keep_r).values,
                       before)
    last = parallel_state.is_pipeline_last_stage()
    logp = torch.cat(outputs) if last else torch.empty(input_ids.shape[0], keep_r, device=input_ids.device)
    return F.pad(_from_last_stage(logp), (0, response_width - keep_r))


def pipeline_forward_backward(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int, vocab_size: int,
    *, micro_batch_size: int, loss_fn: MicroLoss, temperature: float = 1.0, head: ResponseHead | None = None,
    before: BeforeForward | None = None,
) -> float:
    """Forward and backward every micro-batch through the schedule, ``loss_fn`` on each micro-batch's response
    log-probs and entropy (or ``head``'s outputs; taken as it is: normalise it in ``loss_fn``); gradients accumulate
    in the parameters' ``.grad`` (call ``finalize_grads`` next). Returns the summed loss, on every stage."""
    from megatron.core import parallel_state

    head = _head_or_logp(head, vocab_size, temperature)
    micro, keep_r, seq = _micro_batches(input_ids, attention_mask, response_width, micro_batch_size)

    def loss_of(stage: Any, out: torch.Tensor, rows: slice, ids: torch.Tensor):
        pad = (0, response_width - keep_r)
        values, entropy = head(stage, out, ids, keep_r)
        loss = loss_fn(TokenOutputs(F.pad(values, pad), None if entropy is None else F.pad(entropy, pad)), rows)
        return loss, torch.ones((), dtype=torch.int), {"loss": loss.detach()}

    outputs = _run(model, micro, seq, False, loss_of, before)
    last = parallel_state.is_pipeline_last_stage()
    total = torch.stack([o["loss"] for o in outputs]).sum().reshape(1) if last else torch.zeros(1, device=input_ids.device)
    return float(_from_last_stage(total))


def finalize_grads(model: Any, spec: DecoderSpec) -> None:
    """What megatron's ``finalize_model_grads`` does for a DDP-wrapped model, for a bare one: sum over TP the
    grads of ``q_layernorm`` / ``k_layernorm`` (replicated, but each rank's covers only its heads), and with
    tied embeddings and PP > 1 sum the first stage's embedding grad with the last stage's ``output_layer`` copy
    over the embedding group. Data-parallel averaging is not done here."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        group = parallel_state.get_tensor_model_parallel_group()
        for name, param in model.named_parameters():
            if param.grad is not None and ("q_layernorm" in name or "k_layernorm" in name):
                dist.all_reduce(param.grad, group=group)
    if spec.tied and parallel_state.get_pipeline_model_parallel_world_size() > 1:
        if parallel_state.is_rank_in_embedding_group():
            weight = model.shared_embedding_or_output_weight()
            dist.all_reduce(weight.grad, group=parallel_state.get_embedding_group())
