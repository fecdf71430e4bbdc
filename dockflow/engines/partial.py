"""Partial rollouts: continue rollouts that a token budget interrupted, possibly under newer weights.

A partial rollout is the rollout layout of ``dockflow.engines.base`` (prompt width P, response width R) whose
unfinished rows (no EOS yet, fewer than R tokens) get up to ``budget`` more tokens per call. The new tokens and
their log-probs (``rollout_log_prob``, under the weights the engine holds now) are appended after the row's
last real token, so the finished row is exactly what one uninterrupted generation would have laid out.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from dockflow.engines.base import GenerationEngine, SamplingParams
from dockflow.engines.rollout_layout import first_eos_mask, rollout_batch


def empty_rollouts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, width_r: int, pad: int) -> TensorDict:
    """Rollouts of left-padded prompts with no response tokens yet."""
    responses = torch.full((prompt_ids.shape[0], width_r), pad, dtype=torch.long)
    out = rollout_batch(prompt_ids, prompt_mask, responses, torch.zeros_like(responses))
    out["rollout_log_prob"] = torch.zeros(responses.shape, dtype=torch.float32)
    return out


def unfinished(data: TensorDict, eos: int) -> torch.Tensor:
    """[B] bool: rows without EOS that still have room for tokens."""
    mask = data["response_mask"].bool()
    has_eos = ((data["responses"] == eos) & mask).any(-1)
    return ~has_eos & (data["response_length"] < data["responses"].shape[1])


def continue_rollouts(
    engine: GenerationEngine, data: TensorDict, params: SamplingParams, seed: int, budget: int | None, pad: int, eos: int
) -> TensorDict:
    """``data`` with each unfinished row continued by up to ``budget`` (None: until EOS or R) sampled tokens."""
    out = data.clone()
    rows = unfinished(data, eos).nonzero().flatten()
    if len(rows) == 0:
        return out
    width_r = data["responses"].shape[1]
    lengths = data["response_length"][rows]
    room = width_r - lengths  # tokens each row may still take
    cap = room.clamp(max=budget) if budget is not None else room
    # Left-pad prompt + response-so-far of each row into one block.
    seqs = [data["input_ids"][r][data["attention_mask"][r].bool()] for r in rows.tolist()]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for k, s in enumerate(seqs):
        ids[k, width - len(s):], mask[k, width - len(s):] = s, 1
    tokens, logp = engine.sample(ids, mask, int(cap.max()), params, seed, generated=lengths, row_caps=cap)
    new_mask = first_eos_mask(tokens, eos) * (torch.arange(tokens.shape[1]) < cap.unsqueeze(1)).long()
    prompt_w = data["input_ids"].shape[1] - width_r
    for k, r in enumerate(rows.tolist()):
        n, at = int(new_mask[k].sum()), int(lengths[k])
        out["responses"][r, at : at + n] = tokens[k, :n]
        out["response_mask"][r, at : at + n] = 1
        out["rollout_log_prob"][r, at : at + n] = logp[k, :n]
        out["input_ids"][r, prompt_w + at : prompt_w + at + n] = tokens[k, :n]
        out["attention_mask"][r, prompt_w + at : prompt_w + at + n] = 1
        out["response_length"][r] = at + n
    return out
