"""Which train prompts each iteration uses: a seeded permutation per epoch, a pure function of the step.

Being stateless, a resumed run picks exactly the prompts an uninterrupted run would have picked: the
iteration is the position in the data.
"""

from __future__ import annotations

import hashlib

import torch

from dockflow.config import Config


class PromptSampler:
    """Prompt indices of iteration ``i``: consecutive slices of per-epoch permutations of the train set."""

    def __init__(self, num_prompts: int, per_iteration: int, seed: int):
        if num_prompts < 1:
            raise ValueError("the train split is empty: no prompts to sample")
        self.num_prompts = num_prompts
        self.per_iteration = per_iteration
        self.seed = seed

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        return torch.randperm(self.num_prompts, generator=torch.Generator().manual_seed(self.seed * 7919 + epoch))

    def indices(self, iteration: int) -> list[int]:
        out: list[int] = []
        pos = iteration * self.per_iteration
        while len(out) < self.per_iteration:
            epoch, offset = divmod(pos, self.num_prompts)
            take = min(self.per_iteration - len(out), self.num_prompts - offset)
            out.extend(self._epoch_order(epoch)[offset : offset + take].tolist())
            pos += take
        return out


def iteration_sampler(cfg: Config) -> PromptSampler:
    """The run's sampler: G prompts (x the plan's sampling rounds) per iteration from the train split, or the
    pair source's train pairs, in the order of ``shuffle_seed(cfg)``."""
    from dockflow.algos.recipe import PreferenceSection
    from dockflow.data import load_task
    from dockflow.data.preferences import preference_splits

    task = load_task(cfg.data, cfg.run.seed, storage=cfg.checkpoint)
    if cfg.plan.has("pairs"):  # it trains on preference pairs
        pairs = cfg.plan.section("pairs", PreferenceSection)
        count = len(preference_splits(pairs, task, cfg.run.seed, cfg.checkpoint)[0])
    else:
        count = len(task.train)
    return PromptSampler(count, cfg.rollout.prompts_per_iter * cfg.plan.sampling.rounds, shuffle_seed(cfg))


def shuffle_seed(cfg: Config) -> int:
    """``data.shuffle_seed``; when null, ``run.seed``, except for a run that continues from a registered model:
    then one derived from the run's name, so each recurring run (named after its KFP run) draws the prompts in
    another order, and a resumed run in the same one."""
    if cfg.data.shuffle_seed is not None:
        return cfg.data.shuffle_seed
    if cfg.model.continue_from == "base":
        return cfg.run.seed
    return int(hashlib.sha256(f"{cfg.run.seed}:{cfg.run.name}".encode()).hexdigest()[:8], 16)
