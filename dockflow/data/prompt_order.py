"""Which train prompts each iteration uses: a seeded permutation per epoch, a pure function of the step.

Being stateless, a resumed run picks exactly the prompts an uninterrupted run would have picked: the
iteration is the position in the data.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class PromptSampler:
    """Prompt indices of iteration ``i``: consecutive slices of per-epoch permutations of the train set, less the
    ``excluded`` prompts (the length policy's, ``data/length_policy.py``)."""

    def __init__(self, num_prompts: int, per_iteration: int, seed: int, excluded: Sequence[int] = ()):
        skipped = set(excluded)
        self.kept = torch.tensor([i for i in range(num_prompts) if i not in skipped], dtype=torch.long)
        if len(self.kept) < 1:
            raise ValueError("the train split is empty: no prompts to sample")
        self.num_prompts = len(self.kept)
        self.per_iteration = per_iteration
        self.seed = seed

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        order = torch.randperm(self.num_prompts, generator=torch.Generator().manual_seed(self.seed * 7919 + epoch))
        return self.kept[order]

    def indices(self, iteration: int) -> list[int]:
        out: list[int] = []
        pos = iteration * self.per_iteration
        while len(out) < self.per_iteration:
            epoch, offset = divmod(pos, self.num_prompts)
            take = min(self.per_iteration - len(out), self.num_prompts - offset)
            out.extend(self._epoch_order(epoch)[offset : offset + take].tolist())
            pos += take
        return out
