"""Log-probs and entropy of chosen tokens from the last stage's final hidden states and this rank's vocabulary shard
of the output layer, a chunk of tokens at a time: the [tokens, vocabulary / tp] logits are never whole.

The vocab-parallel form of ``dockflow.engines.token_head``: each TP rank holds rows ``[start, start + V/tp)`` of the
(padded) output weight and the full hidden states. Per chunk of ``chunk`` tokens a rank forms its logits (fp32, over
the temperature; the padding rows past the true vocabulary are left out), and the TP group all-reduces the row max
(MAX), then the sum of exps, the target's logit (from the rank that holds it) and the sum of ``exp * logit`` (SUM):
the log-prob, the logsumexp and the entropy (a metric, no gradient). The forward keeps each token's logsumexp only;
the backward recomputes a chunk's local logits, forms ``g * (onehot - softmax) / temperature`` on this rank's
columns, adds its share to the weight shard's gradient and returns this rank's part of the hidden state's gradient;
``copy_to_tensor_model_parallel_region`` on the hidden (as ``ColumnParallelLinear`` does with its input) sums the
parts over TP in its backward. Peak memory is about ``chunk x V/tp`` floats, for one more head matmul in backward.

Runs inside a rank after ``model.init_model_parallel``; megatron is imported in the functions only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from dockflow.engines.logprobs import TokenOutputs
from dockflow.engines.token_head import DEFAULT_CHUNK


class _Shard(NamedTuple):
    """This rank's rows of the output weight: the first vocabulary id, how many are real (not padding), the
    sampling temperature, the tokens per chunk and the TP group."""

    start: int
    valid: int
    temperature: float
    chunk: int
    group: Any


def _local_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """A chunk's logits over this rank's real vocabulary rows, float32, over the temperature."""
    logits = (hidden @ weight.t()).float()
    return logits / temperature if temperature != 1.0 else logits


def _local_targets(targets: torch.Tensor, shard: _Shard) -> tuple[torch.Tensor, torch.Tensor]:
    """(whether this rank holds each target, its column here: 0 where it does not)."""
    local = (targets >= shard.start) & (targets < shard.start + shard.valid)
    return local, torch.where(local, targets - shard.start, 0)


class _VocabParallelTokenLogProb(torch.autograd.Function):
    """log p(target) per token (differentiable) and the entropy per token (no gradient), over the TP group."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                shard: _Shard) -> tuple[torch.Tensor, torch.Tensor]:
        n, rows = hidden.shape[0], weight[: shard.valid]
        local, column = _local_targets(targets, shard)
        logp, entropy, lse = (hidden.new_empty(n, dtype=torch.float32) for _ in range(3))
        for start in range(0, n, shard.chunk):
            end = min(start + shard.chunk, n)
            logits = _local_logits(hidden[start:end], rows, shard.temperature)  # [c, valid]
            shift = logits.amax(-1) if shard.valid else logits.new_full((end - start,), float("-inf"))
            dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=shard.group)
            shifted = logits.sub_(shift[:, None])  # in place
            exp = shifted.exp()
            target = shifted.gather(-1, column[start:end, None]).squeeze(-1) if shard.valid else shift * 0
            total = exp.sum(-1)
            sums = torch.stack([total, target * local[start:end], shifted.mul_(exp).sum(-1)])  # in place
            dist.all_reduce(sums, group=shard.group)  # sum of exps, target logit, sum of exp * logit (shifted)
            log_total = sums[0].log()
            lse[start:end] = shift + log_total
            logp[start:end] = sums[1] - log_total
            entropy[start:end] = log_total - sums[2] / sums[0]
            del logits, shifted, exp  # before the next chunk's are made
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.shard = shard
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor, _grad_entropy: torch.Tensor):
        hidden, weight, targets, lse = ctx.saved_tensors
        shard: _Shard = ctx.shard
        rows = weight[: shard.valid]
        local, column = _local_targets(targets, shard)
        need_h, need_w = ctx.needs_input_grad[:2]
        grad_h = torch.zeros_like(hidden) if need_h else None  # this rank's part; TP sums the parts
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None  # padding rows stay 0
        for start in range(0, hidden.shape[0] if shard.valid else 0, shard.chunk):
            end = min(start + shard.chunk, hidden.shape[0])
            g = grad_logp[start:end, None].float()
            logits = _local_logits(hidden[start:end], rows, shard.temperature)
            # d logp / d logits = onehot(target) - softmax, on this rank's columns; over the temperature
            grad_logits = logits.sub_(lse[start:end, None]).exp_().mul_(-g)  # in place
            grad_logits.scatter_add_(-1, column[start:end, None], g * local[start:end, None])
            if shard.temperature != 1.0:
                grad_logits /= shard.temperature
            if need_h:
                grad_h[start:end] = (grad_logits.to(rows.dtype) @ rows).to(hidden.dtype)
            if need_w:
                grad_w[: shard.valid].addmm_(grad_logits.t(), hidden[start:end].float())
            del logits, grad_logits  # before the next chunk's are made
        return grad_h, grad_w.to(weight.dtype) if need_w else None, None, None


def vocab_parallel_log_probs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int, *,
                             temperature: float = 1.0, chunk: int = DEFAULT_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob of each target, entropy of each position's distribution) for hidden states [..., H] (the same on
    every TP rank) and targets [...], from this rank's rows ``weight`` [V_padded / tp, H] of the output weight; the
    rows past ``vocab_size`` are padding. Only the log-probs carry a gradient (to ``hidden`` summed over TP, and
    to ``weight``)."""
    from megatron.core import parallel_state, tensor_parallel

    rank = parallel_state.get_tensor_model_parallel_rank()
    width = weight.shape[0]
    shard = _Shard(start=rank * width, valid=min(max(vocab_size - rank * width, 0), width),
                   temperature=temperature, chunk=chunk, group=parallel_state.get_tensor_model_parallel_group())
    hidden = tensor_parallel.copy_to_tensor_model_parallel_region(hidden.reshape(-1, hidden.shape[-1]))
    logp, entropy = _VocabParallelTokenLogProb.apply(hidden, weight, targets.reshape(-1), shard)
    return logp.view(targets.shape), entropy.view(targets.shape)


def output_weight(model: Any) -> torch.Tensor:
    """The last stage's output weight shard: the embedding when tied (its last-stage copy at PP > 1)."""
    if model.share_embeddings_and_output_weights:
        return model.shared_embedding_or_output_weight()
    return model.output_layer.weight


def response_outputs(model: Any, hidden: torch.Tensor, ids: torch.Tensor, keep_r: int, vocab_size: int, *,
                     temperature: float = 1.0, chunk: int = DEFAULT_CHUNK) -> TokenOutputs:
    """The kept response columns' log-probs and entropy [B, keep_r] from the last stage's final hidden states
    [S, B, H] (``model.forward_rollout``): the positions that predict each response token."""
    if model.config.sequence_parallel:
        raise ValueError("megatron log-probs: sequence_parallel is not supported (the hidden states are split)")
    hidden = hidden[-keep_r - 1 : -1].transpose(0, 1)  # [B, keep_r, H]
    logp, entropy = vocab_parallel_log_probs(hidden, output_weight(model), ids[:, -keep_r:], vocab_size,
                                             temperature=temperature, chunk=chunk)
    return TokenOutputs(logp, entropy)
