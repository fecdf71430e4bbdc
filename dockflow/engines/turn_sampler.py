"""Turns of many tool-loop trajectories sampled together over a generation engine's ``sample``: the
``generate_batch`` that ``dockflow.agents.run_rollouts`` takes (RL tool rollouts in ``dockflow.rollout.multi_turn``,
held-out tool scores in ``dockflow.eval.tool_scores``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from dockflow.engines.interfaces import GenerationEngine, SamplingParams

# one turn asked for, as ``dockflow.agents.batch_loop.GenerateBatch`` passes it (engines do not import agents):
Request = tuple[int, list[int], int]  # (trajectory index, token ids so far, max new tokens)


class BatchSampler:
    """``generate_batch`` for ``run_rollouts`` over an engine's ``sample``: the turns asked for are left-padded
    into one batch and sampled together (up to the largest budget, each row then cut at its own budget and
    after its EOS); each trajectory's model tokens end within ``params.max_new_tokens`` of its prompt. The
    log-probs of each trajectory's model tokens are kept in order (``logps[k]``)."""

    def __init__(self, engine: GenerationEngine, tokenizer: Any, params: SamplingParams, seed: int) -> None:
        self.engine, self.params, self.seed, self.calls = engine, params, seed, 0
        self.eos, self.pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        self.logps: dict[int, list[float]] = defaultdict(list)
        self.ends: dict[int, int] = {}  # trajectory -> prompt length + max_new_tokens: no model token past it

    def __call__(self, requests: list[Request]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in requests]
        live = []
        for j, (k, ids, budget) in enumerate(requests):
            end = self.ends.setdefault(k, len(ids) + self.params.max_new_tokens)
            cap = min(budget, end - len(ids))
            if cap > 0:  # else the response width is spent (only tool tokens past it, which are cut)
                live.append((j, k, ids, cap))
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
            new = tokens[row, :cap].tolist()
            if self.eos in new:
                new = new[: new.index(self.eos) + 1]
            out[j] = new
            self.logps[k] += logp[row, : len(new)].tolist()
        return out
