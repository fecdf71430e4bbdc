"""Helpers of the agents tests. A tokenizer whose chat template supports tools, built locally: the tiny model's character tokenizer with
Qwen2.5's ChatML tokens and Qwen2.5's own chat template (the copy TRL ships and recognises)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedTokenizerFast
from trl.chat_template_utils import qwen2_5_chat_template

from dockflow.engines.interfaces import GenerationEngine


def qwen_style(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer


def scripted(tokenizer: PreTrainedTokenizerFast, turns: Sequence[str]) -> tuple[Callable, list[list[int]]]:
    """A ``generate`` that answers each call with the next text of ``turns`` (encoded, then EOS), and the list of
    the ids it returned."""
    emitted: list[list[int]] = []

    def generate(ids: list[int], max_new_tokens: int) -> list[int]:
        new = tokenizer.encode(turns[len(emitted)], add_special_tokens=False) + [tokenizer.eos_token_id]
        emitted.append(new[:max_new_tokens])
        return new

    return generate, emitted


def call(name: str, arguments: str) -> str:
    """A tool call as Qwen2.5's template renders one."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def prefix_turns(
    tokenizer: PreTrainedTokenizerFast, scripts: dict[str, Sequence[str]] | Callable[[str], Sequence[str]]
) -> Callable:
    """``next_ids(ids, max_new) -> (new ids, offset)``: a model whose next tokens are a function of the ids alone (as a
    real model's are), so a turn cut anywhere (partial rollout) goes on with the same tokens. The turn is the number
    of assistant headers after the prompt's, its tokens so far (``offset`` of them) those after the last header; the
    script is the first of ``scripts`` whose key is in the prompt's text (or ``scripts(text)``); each turn ends with
    EOS."""
    header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)

    def next_ids(ids: list[int], max_new: int) -> tuple[list[int], int]:
        starts = [i for i in range(len(ids) - len(header) + 1) if ids[i : i + len(header)] == header]
        text = tokenizer.decode(ids[: starts[0]])
        script = scripts(text) if callable(scripts) else next(v for key, v in scripts.items() if key in text)
        turn = tokenizer.encode(script[len(starts) - 1], add_special_tokens=False) + [tokenizer.eos_token_id]
        so_far = len(ids) - starts[-1] - len(header)
        return turn[so_far : so_far + max_new], so_far

    return next_ids


def prefix_batch(tokenizer: PreTrainedTokenizerFast, scripts: dict[str, Sequence[str]]) -> Callable:
    """``prefix_turns`` as a ``generate_batch`` for ``run_rollouts``."""
    next_ids = prefix_turns(tokenizer, scripts)
    return lambda requests: [next_ids(ids, n)[0] for _, ids, n in requests]


class SampleOnlyEngine(GenerationEngine):
    """A fake engine the tool loop drives through ``sample`` alone; the rest of the interface is not used."""

    def generate(self, prompts, params, seed, prompt_width=None):
        raise NotImplementedError

    def decode(self, responses, response_mask):
        raise NotImplementedError

    def load_weights(self, weights):
        raise NotImplementedError

    def prompt_width(self, prompts):
        raise NotImplementedError


class PrefixEngine(SampleOnlyEngine):
    """An engine whose ``sample`` gives each row its next tokens as a function of its ids alone (``prefix_turns``),
    with log-prob -(the token's position in its turn + 1) / 100: a turn cut anywhere goes on with the same tokens and
    log-probs. ``batches``: the rows of each ``sample`` call."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast, scripts: dict | Callable) -> None:
        self.tokenizer, self.next_ids, self.batches = tokenizer, prefix_turns(tokenizer, scripts), []

    def sample(self, input_ids, attention_mask, max_new_tokens, params, seed, generated=None, row_caps=None):
        tokens = torch.full((input_ids.shape[0], max_new_tokens), self.tokenizer.pad_token_id)
        logp = torch.zeros(tokens.shape)
        for row in range(input_ids.shape[0]):
            new, offset = self.next_ids(input_ids[row][attention_mask[row].bool()].tolist(), max_new_tokens)
            tokens[row, : len(new)] = torch.tensor(new, dtype=torch.long)
            logp[row, : len(new)] = -torch.arange(offset + 1, offset + len(new) + 1, dtype=torch.float32) / 100
        self.batches.append(input_ids.shape[0])
        return tokens, logp

