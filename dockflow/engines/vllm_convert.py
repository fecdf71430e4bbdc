"""The vLLM engine's pure parts: DockFlow's sampling parameters as vLLM ``SamplingParams`` keyword arguments,
vLLM's outputs as rows of the rollout layout (``engines/interfaces.py``), and the training model's weights as the
names and tensors vLLM's model loaders take. Plain values in and out, no ``vllm`` import, so all of it is
tested on a CPU machine (``tests/unit/engines/test_vllm_convert.py``).

Written against vLLM 0.33.0 (``vllm/sampling_params.py``, ``vllm/outputs.py``, ``vllm/logprobs.py``,
``vllm/v1/core/sched/utils.py``); the names used also exist in the vLLM 0.23 that vLLM-Ascend 0.23 pins
(docs/engines.md says what differs).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dockflow.engines.interfaces import SamplingParams

FINISHED = ("stop", "length")  # vLLM's finish reasons of a completed row; abort / error / repetition are failures


class VLLMOutputError(RuntimeError):
    """vLLM returned something the rollout layout cannot hold as DockFlow's HF engine would have made it."""


def sampling_kwargs(params: SamplingParams, max_tokens: int, eos_id: int, seed: int, n: int) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` that sample as ``HFGenerationEngine`` does.

    - temperature / top_p as given; greedy is vLLM's temperature 0 (top-k is left at vLLM's "off" default);
    - stop only at the tokenizer's EOS, like ``generate(eos_token_id=eos)``: ``ignore_eos`` drops the model's
      own EOS and the extra ones vLLM reads from ``generation_config.json``, ``stop_token_ids=[eos]`` stops at
      ours (the stop token stays in ``token_ids``);
    - ``logprobs=0``: the sampled token's log-prob only. With the engine's ``logprobs_mode="processed_logprobs"``
      that is the log-softmax of the logits divided by the temperature (after top-p masking: equal to
      DockFlow's only with ``top_p == 1``, which the config enforces where the log-probs are used);
    - ``detokenize=False``: DockFlow decodes with its own tokenizer.
    """
    return {
        "n": n,
        "temperature": 0.0 if params.greedy else float(params.temperature),
        "top_p": 1.0 if params.greedy else float(params.top_p),
        "max_tokens": int(max_tokens),
        "min_tokens": 0,
        "ignore_eos": True,
        "stop_token_ids": [int(eos_id)],
        "logprobs": 0,
        "seed": int(seed),
        "detokenize": False,
    }


def expand_requests(num_prompts: int, n: int, greedy: bool) -> list[tuple[int, int]]:
    """(prompt index, ``n`` of the request) per vLLM request, prompt-major. vLLM refuses ``n > 1`` when greedy,
    so a greedy group is ``n`` requests of one sample each (identical responses, as HF's greedy gives)."""
    if greedy:
        return [(i, 1) for i in range(num_prompts) for _ in range(n)]
    return [(i, n) for i in range(num_prompts)]


def request_seeds(seed: int, requests: Sequence[tuple[int, int]]) -> list[int]:
    """One seed per request, derived from the engine call's ``seed``. vLLM gives the k-th sample of a request
    ``seed + k`` (``v1/engine/parallel_sampling.py``), so requests are spaced by their ``n``: no two samples of
    one call share a seed, and the same call samples the same tokens again."""
    base = random.Random(seed).randrange(2**31)
    seeds, at = [], base
    for _, n in requests:
        seeds.append(at)
        at += n
    return seeds


def prompt_token_lists(input_ids: Sequence[Sequence[int]], attention_mask: Sequence[Sequence[int]]) -> list[list[int]]:
    """The real tokens of left-padded rows (what vLLM is given as ``TokensPrompt(prompt_token_ids=...)``)."""
    return [[int(t) for t, m in zip(ids, mask, strict=True) if m] for ids, mask in zip(input_ids, attention_mask, strict=True)]


@dataclass(frozen=True)
class Completion:
    """One sampled response as plain values: its tokens, each token's log-prob, and why it ended."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None


def sampled_logprobs(token_ids: Sequence[int], per_position: Sequence[Any] | None) -> list[float]:
    """The sampled token's log-prob at each position, from vLLM's ``CompletionOutput.logprobs``: one mapping per
    position, token id -> ``Logprob`` (``.logprob``) or a float; ``FlatLogprobs`` reads the same way."""
    if per_position is None:
        raise VLLMOutputError("vLLM returned no log-probs: the request must set logprobs=0")
    if len(per_position) != len(token_ids):
        raise VLLMOutputError(f"vLLM returned {len(per_position)} log-prob positions for {len(token_ids)} tokens")
    out = []
    for pos, (tok, entry) in enumerate(zip(token_ids, per_position, strict=True)):
        if entry is None or int(tok) not in entry:
            raise VLLMOutputError(f"vLLM's log-probs at position {pos} do not hold the sampled token {tok}")
        value = entry[int(tok)]
        out.append(float(getattr(value, "logprob", value)))
    return out


def completion_of(output: Any) -> Completion:
    """A vLLM ``CompletionOutput`` (``token_ids``, ``logprobs``, ``finish_reason``) as a :class:`Completion`."""
    tokens = [int(t) for t in output.token_ids]
    return Completion(tokens, sampled_logprobs(tokens, output.logprobs), output.finish_reason)


def completions_in_order(request_outputs: Sequence[Any]) -> list[Completion]:
    """Every sample of every request, request by request and within a request by ``CompletionOutput.index`` (the
    rollout layout puts a prompt's N responses on consecutive rows)."""
    return [completion_of(c) for out in request_outputs for c in sorted(out.outputs, key=lambda c: c.index)]


def response_rows(
    completions: Sequence[Completion], max_tokens: int, eos_id: int, pad_id: int, caps: Sequence[int] | None = None
) -> tuple[list[list[int]], list[list[float]], list[int]]:
    """(tokens, log-probs, lengths), one row of width ``max_tokens`` per completion, as the HF engine lays them
    out: the tokens up to and including the first EOS, then ``pad_id``; log-prob 0 past the length. A row ends
    with EOS or has all its tokens (``caps[k]``, else ``max_tokens``); anything else (an aborted row, a row cut
    by ``max_model_len``) raises :class:`VLLMOutputError`, since the layout would read it as complete."""
    tokens_out, logp_out, lengths = [], [], []
    for k, c in enumerate(completions):
        cap = max_tokens if caps is None else int(caps[k])
        if c.finish_reason not in FINISHED:
            raise VLLMOutputError(f"vLLM finished row {k} with reason {c.finish_reason!r}, not one of {FINISHED}")
        if len(c.logprobs) != len(c.token_ids):
            raise VLLMOutputError(f"row {k}: {len(c.logprobs)} log-probs for {len(c.token_ids)} tokens")
        tokens = c.token_ids[:cap]
        length = tokens.index(eos_id) + 1 if eos_id in tokens else len(tokens)
        if length < cap and (length == 0 or tokens[length - 1] != eos_id):
            raise VLLMOutputError(
                f"row {k} has {length} of {cap} tokens and no EOS (finish reason {c.finish_reason!r}): vLLM "
                "stopped it early; raise engine.vllm.max_model_len or lower rollout.max_new_tokens"
            )
        tokens_out.append(tokens[:length] + [pad_id] * (max_tokens - length))
        logp_out.append([float(x) for x in c.logprobs[:length]] + [0.0] * (max_tokens - length))
        lengths.append(length)
    return tokens_out, logp_out, lengths


def rows_as_tensors(
    tokens: list[list[int]], logprobs: list[list[float]], lengths: list[int], width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens [B, width] long, log-probs [B, width] float32, response mask [B, width] long) of
    :func:`response_rows`' output."""
    b = len(tokens)
    t = torch.tensor(tokens, dtype=torch.long).reshape(b, width)
    lp = torch.tensor(logprobs, dtype=torch.float32).reshape(b, width)
    mask = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths, dtype=torch.long).reshape(b, 1)).long()
    return t, lp, mask


# -- weights ------------------------------------------------------------------------------------------------

# Prefixes that wrappers put in front of parameter names: torch.compile, activation checkpointing, DDP.
_WRAPPER_PARTS = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")
_FUSED_EXPERTS = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<kind>gate_up_proj|down_proj)$")
SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen3MoeForCausalLM")


def strip_wrappers(name: str) -> str:
    """A parameter's name as the bare transformers model names it."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name.removeprefix("module.")


def checkpoint_weights(
    named: Iterable[tuple[str, torch.Tensor]], tie_word_embeddings: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """The training model's parameters as a Hugging Face checkpoint of Qwen2 / Qwen3-MoE names them, which is what
    vLLM's ``Qwen2ForCausalLM`` / ``Qwen3MoeForCausalLM.load_weights`` take (they stack q/k/v and gate/up and
    slice every tensor for their tensor-parallel rank themselves, so tensors go in full):

    - wrapper prefixes dropped (:func:`strip_wrappers`);
    - transformers 5's fused experts, ``mlp.experts.gate_up_proj`` [E, 2I, H] (gate rows first) and
      ``mlp.experts.down_proj`` [E, H, I], split into the per-expert ``mlp.experts.{e}.gate_proj.weight`` [I, H],
      ``up_proj.weight`` [I, H] and ``down_proj.weight`` [H, I] of the checkpoint (views, no copy);
    - ``lm_head.weight`` dropped when the embeddings are tied (the checkpoint has none; vLLM ties it itself).
    """
    for raw, tensor in named:
        name = strip_wrappers(raw)
        if tie_word_embeddings and name == "lm_head.weight":
            continue
        fused = _FUSED_EXPERTS.match(name)
        if fused is None:
            yield name, tensor
            continue
        prefix = fused["prefix"]
        if fused["kind"] == "down_proj":
            for e in range(tensor.shape[0]):
                yield f"{prefix}.{e}.down_proj.weight", tensor[e]
            continue
        if tensor.shape[1] % 2:
            raise ValueError(f"{name}: fused gate/up rows {tensor.shape[1]} are not even")
        half = tensor.shape[1] // 2
        for e in range(tensor.shape[0]):
            yield f"{prefix}.{e}.gate_proj.weight", tensor[e, :half]
            yield f"{prefix}.{e}.up_proj.weight", tensor[e, half:]


def weight_buckets(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of at most ``bucket_bytes`` (a tensor larger than that is a bucket of its own), so a
    weight sync streams the model instead of holding a second copy of it."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
