"""The rollout layout of ``dockflow.engines.interfaces`` built from tokens and text, for every generation backend
(``hf_generation``, ``vllm_generation``, ``cost_model``), partial rollout (``dockflow.rollout.partial``) and the
workers that pad prompts, score fixed responses or decode them. Nothing here depends on a backend.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict


def first_eos_mask(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 on tokens up to and including the first EOS of each row (all of the row if it has none)."""
    is_eos = tokens == eos_id
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    return (~after_eos).long()


def response_ids(responses: torch.Tensor, response_mask: torch.Tensor) -> list[list[int]]:
    """Each row's masked-in response token ids (EOS included), as lists."""
    # One tolist per tensor: indexing row by row costs ~7 us a row (1.8 ms for the demo's 256 rows).
    return [[t for t, keep in zip(row, mask, strict=True) if keep]
            for row, mask in zip(responses.tolist(), response_mask.tolist(), strict=True)]


def decode_responses(tokenizer, responses: torch.Tensor, response_mask: torch.Tensor,
                     ids: list[list[int]] | None = None) -> list[str]:
    """Response tokens to text, keeping masked-in tokens and dropping special ones (EOS); ``ids``: the rows'
    ``response_ids`` when the caller has them already."""
    ids = response_ids(responses, response_mask) if ids is None else ids
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


def left_pad_prompts(tokenizer, prompts: list[str], width: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt ids and mask, left-padded to ``width`` (None: the longest prompt)."""
    # Special tokens as the tokenizer adds them (e.g. BOS), exactly as SFT saw its prompts.
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    longest = max(len(x) for x in ids)
    width = longest if width is None else width
    if longest > width:
        raise ValueError(f"a prompt has {longest} tokens, more than the prompt width {width}")
    input_ids = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        if row:
            input_ids[i, width - len(row) :] = torch.tensor(row)
            mask[i, width - len(row) :] = 1
    return input_ids, mask


def encode_rollouts(tokenizer, prompts: list[str], responses: list[str], response_width: int) -> TensorDict:
    """Given (prompt, response text) pairs in the rollout layout of ``dockflow.engines.interfaces``, as if generated:
    each response is its tokens plus EOS, cut at ``response_width`` (then it has no EOS, like a truncated
    generation). Used to score fixed responses, e.g. DPO's chosen and rejected answers."""
    prompt_ids, prompt_mask = left_pad_prompts(tokenizer, prompts, None)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    responses_t = torch.full((len(responses), response_width), pad, dtype=torch.long)
    response_mask = torch.zeros_like(responses_t)
    for i, text in enumerate(responses):
        row = (tokenizer(text, add_special_tokens=False)["input_ids"] + [eos])[:response_width]
        responses_t[i, : len(row)] = torch.tensor(row)
        response_mask[i, : len(row)] = 1
    return rollout_batch(prompt_ids, prompt_mask, responses_t, response_mask)


def rollout_batch(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor, response_mask: torch.Tensor
) -> TensorDict:
    """The rollout layout of ``dockflow.engines.interfaces`` from left-padded prompts and right-padded responses."""
    return TensorDict(
        {
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
            "responses": responses,
            "response_mask": response_mask,
            "prompt_length": prompt_mask.sum(-1),
            "response_length": response_mask.sum(-1),
        },
        batch_size=[responses.shape[0]],
    )
