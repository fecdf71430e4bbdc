"""Log-probs and entropy of chosen tokens from the last hidden state, a chunk of tokens at a time: the [tokens,
vocabulary] logits are never whole, in the forward pass or the backward pass.

A real vocabulary makes the logits the largest tensor of an RL update: 8 responses x 4,096 tokens x 151,936 fp32
logits are 19 GiB, and ``log_softmax`` plus its backward keep two or three such tensors alive. Here the lm_head is
applied to ``chunk`` tokens at a time; the forward keeps only each token's logsumexp, and the backward recomputes a
chunk's logits to form its gradient (``softmax - onehot``) and adds its share to the hidden state's and the head's
gradients. Peak memory is then about ``chunk x vocabulary`` floats whatever the batch is, for one more head matmul
in the backward pass. The design is Liger-Kernel's fused linear cross-entropy and Cut Cross-Entropy's, written with
torch ops (their kernels are CUDA / Triton only).

    logp, entropy = chunked_log_probs(hidden, head.weight, head.bias, targets, temperature=0.7, chunk=512)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

DEFAULT_CHUNK = 512  # tokens per head matmul: 512 x 151,936 fp32 logits are 297 MiB (benchmarks/scale.py)


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  temperature: float) -> torch.Tensor:
    """A chunk's logits in float32, divided by the sampling temperature."""
    logits = (hidden @ weight.t()).float()
    if bias is not None:
        logits = logits + bias.float()
    return logits / temperature if temperature != 1.0 else logits


class _ChunkedTokenLogProb(torch.autograd.Function):
    """log p(target) per token (differentiable) and the distribution's entropy per token (a metric, no gradient)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, temperature: float, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        logp = hidden.new_empty(n, dtype=torch.float32)
        entropy = hidden.new_empty(n, dtype=torch.float32)
        lse = hidden.new_empty(n, dtype=torch.float32)
        for start in range(0, n, chunk):  # two [chunk, V] buffers at most: the logits and their exp
            end = min(start + chunk, n)
            logits = _chunk_logits(hidden[start:end], weight, bias, temperature)
            shift = logits.amax(-1, keepdim=True)
            exp = torch.exp(logits.sub_(shift))
            total = exp.sum(-1, keepdim=True)
            logp_all = logits.sub_(total.log())  # in place: the log-probs of every token
            lse[start:end] = (shift + total.log()).squeeze(-1)
            logp[start:end] = logp_all.gather(-1, targets[start:end, None]).squeeze(-1)
            entropy[start:end] = -exp.div_(total).mul_(logp_all).sum(-1)
            del logits, logp_all, exp  # before the next chunk's are made
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor, _grad_entropy: torch.Tensor):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            end = min(start + ctx.chunk, hidden.shape[0])
            logits = _chunk_logits(hidden[start:end], weight, bias, ctx.temperature)
            # d logp / d logits = onehot(target) - softmax; times the upstream gradient, over the temperature
            grad_logits = logits.sub_(lse[start:end, None]).exp_().mul_(-grad_logp[start:end, None])  # in place
            grad_logits.scatter_add_(-1, targets[start:end, None], grad_logp[start:end, None].float())
            if ctx.temperature != 1.0:
                grad_logits /= ctx.temperature
            if need_h:
                grad_h[start:end] = (grad_logits @ weight.float()).to(hidden.dtype)
            if need_w:
                grad_w.addmm_(grad_logits.t(), hidden[start:end].float())
            if need_b:
                grad_b += grad_logits.sum(0)
            del logits, grad_logits  # before the next chunk's are made
        return (grad_h, grad_w.to(weight.dtype) if need_w else None,
                grad_b.to(bias.dtype) if need_b else None, None, None, None)


def chunked_log_probs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                    *, temperature: float = 1.0, chunk: int = DEFAULT_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob of each target, entropy of each position's distribution) for hidden states [..., H] and targets
    [...], at the sampling temperature; only the log-probs carry a gradient."""
    shape = targets.shape
    logp, entropy = _ChunkedTokenLogProb.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, bias, targets.reshape(-1), temperature, chunk)
    return logp.view(shape), entropy.view(shape)


def output_head(model: nn.Module) -> nn.Linear:
    """The causal LM's lm_head (tied or not); a model whose logits are not one linear map is refused."""
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None):
        raise ValueError(f"{type(model).__name__}: final_logit_softcapping is not supported by the chunked "
                         "log-probs (dockflow/engines/token_head.py); use a model without logit softcapping")
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError(f"{type(model).__name__}: its output embedding is {type(head).__name__}, not a linear "
                         "head; the chunked log-probs need one")
    return head
