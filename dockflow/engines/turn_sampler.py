"""Turns of many tool-loop trajectories over a generation engine: the sampler that ``dockflow.agents.run_rollouts``
takes (RL tool rollouts in ``dockflow.rollout.multi_turn``, held-out tool scores in ``dockflow.eval.tool_scores``).

    sampler = turn_sampler(engine, tokenizer, params, seed)

- ``BatchSampler`` (the HF engine): the turns asked for are sampled together, one ``sample`` call per round of
  turns. transformers' ``generate`` draws a batch from one RNG, so a row's tokens depend on which rows share its
  call: the batch is the unit that makes runs reproducible.
- ``engine.turn_stream`` (vLLM: ``dockflow.engines.vllm_turns.VLLMTurnStream``): each turn is its own request,
  seeded on its own, submitted when its trajectory asks and collected when the engine finishes it, so a
  trajectory never waits for the rest of its batch (``dockflow.agents.stream_loop``).

Both keep the same books (``TurnLedger``): a trajectory's model tokens end within ``params.max_new_tokens`` of
its prompt (the response width of the rollout layout), a turn ends after its EOS, and the log-probs of each
trajectory's model tokens are kept in order (``logps[k]``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from dockflow.engines.interfaces import GenerationEngine, SamplingParams

# one turn asked for, as ``dockflow.agents.batch_loop.GenerateBatch`` passes it (engines do not import agents):
Request = tuple[int, list[int], int]  # (trajectory index, token ids so far, max new tokens)


class TurnLedger:
    """Per trajectory ``k``: where its model tokens must end (``ends[k]``: prompt length + max new tokens, set at
    its first turn) and the log-probs of its model tokens so far (``logps[k]``)."""

    def __init__(self, tokenizer: Any, params: SamplingParams) -> None:
        self.params = params
        self.eos, self.pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        self.logps: dict[int, list[float]] = defaultdict(list)
        self.ends: dict[int, int] = {}

    def room(self, k: int, ids: list[int], budget: int) -> int:
        """Tokens trajectory ``k`` may take in its next turn: ``budget``, within its response width (<= 0: spent;
        only tool tokens lie past it, and they are cut)."""
        end = self.ends.setdefault(k, len(ids) + self.params.max_new_tokens)
        return min(budget, end - len(ids))

    def record(self, k: int, tokens: list[int], logps: list[float]) -> list[int]:
        """The turn's tokens up to and including its first EOS; their log-probs appended to ``logps[k]``."""
        if self.eos in tokens:
            tokens = tokens[: tokens.index(self.eos) + 1]
        self.logps[k] += [float(x) for x in logps[: len(tokens)]]
        return tokens


class BatchSampler(TurnLedger):
    """``generate_batch`` for ``run_rollouts`` over an engine's ``sample``: the turns asked for are left-padded
    into one batch and sampled together (up to the largest budget, each row then cut at its own budget and
    after its EOS); call ``c`` of the sampler samples with seed ``seed + c``."""

    def __init__(self, engine: GenerationEngine, tokenizer: Any, params: SamplingParams, seed: int) -> None:
        super().__init__(tokenizer, params)
        self.engine, self.seed, self.calls = engine, seed, 0

    def __call__(self, requests: list[Request]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in requests]
        live = [(j, k, ids, cap) for j, (k, ids, budget) in enumerate(requests)
                if (cap := self.room(k, ids, budget)) > 0]
        if not live:
            return out
        width = max(len(ids) for _, _, ids, _ in live)
        input_ids = torch.full((len(live), width), self.pad, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, (_, _, ids, _) in enumerate(live):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention[row, width - len(ids) :] = 1
        longest = max(cap for *_, cap in live)
        tokens, logp = self.engine.sample(input_ids, attention, longest, self.params, self.seed + self.calls)
        self.calls += 1
        for row, (j, k, _, cap) in enumerate(live):
            out[j] = self.record(k, tokens[row, :cap].tolist(), logp[row, :cap].tolist())
        return out


def turn_sampler(engine: GenerationEngine, tokenizer: Any, params: SamplingParams, seed: int) -> Any:
    """The engine's own turn stream where it has one (each trajectory's turns are requests of their own), else a
    ``BatchSampler``."""
    stream = engine.turn_stream(tokenizer, params, seed)
    return stream if stream is not None else BatchSampler(engine, tokenizer, params, seed)
