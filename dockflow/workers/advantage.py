"""The advantage state of the reward worker: which scored groups get advantages, the algorithm's estimator over
them, and the dock puts of ``advantages`` (and ``returns``).

The groups come from the run plan's sampling (``RunPlan.sampling``): without a group selector every group of a
round gets advantages; with one (DAPO's dynamic sampling, ``algos/dapo.py``) each round's groups go
through ``selector.select`` until the iteration has ``sampling.quota`` of them, and the round loop
(``flow/iteration.py``) reads the count from the ``RoundAdvantages`` each call returns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from dockflow.algos.groups import informative_groups
from dockflow.algos.plan import RunPlan
from dockflow.config import Config
from dockflow.dock import DockRequest, TransferDock
from dockflow.workers.consume import consume


def filtration_seed(run_seed: int, iteration: int) -> int:
    """Seed of PF-PPO's reward-weighted sampling in one iteration (resume-stable)."""
    return (run_seed * 7_919 + iteration * 104_729) % 2**62


@dataclass(frozen=True)
class RoundAdvantages:
    """What one advantage call did, as of the end of its round."""

    kept: int  # groups given advantages so far in this iteration (every round up to this one)
    filled: int  # of those, groups the selector took only to fill the batch
    metrics: dict[str, float] = field(default_factory=dict)  # the round's own: zero-advantage groups, timing


class AdvantageState:
    """Consumer state ``advantage``: reads ``rewards`` (and what the estimator needs), writes ``advantages``."""

    def __init__(self, cfg: Config, plan: RunPlan, dock: TransferDock) -> None:
        self.cfg, self.plan, self.dock = cfg, plan, dock
        self.recipe = plan.recipe  # the advantage estimator
        self.sampling = plan.sampling
        self.columns = plan.role("reward").reads["advantage"]
        self.kept = self.filled = 0  # this iteration's, over its rounds

    def compute(self, iteration: int, round_index: int = 0, last_round: bool = True) -> RoundAdvantages:
        """Advantages of one generation round. With a group selector only the groups it selects get them, up to
        the sampling quota over the iteration's rounds; ``last_round`` lets it fill what is still missing."""
        start = time.perf_counter()
        if round_index == 0:
            self.kept = self.filled = 0
        n, selector = self.cfg.rollout.group_size, self.sampling.selector
        generator = torch.Generator().manual_seed(filtration_seed(self.cfg.run.seed, iteration))
        zero_groups = groups = 0
        request = DockRequest("advantage", self.recipe.advantage_batch_size(self.cfg), self.columns,
                              whole_groups=True, window=self.plan.dock_window(iteration))
        for batch in consume(self.dock, request, self.cfg.global_batch):
            data, indices = batch.data, batch.indices
            informative = informative_groups(data["rewards"], n)
            groups += len(informative)
            zero_groups += int((~informative).sum())
            if selector is None:
                self.kept += len(informative)
            else:
                picked = selector.select(data["rewards"], n, self.sampling.quota - self.kept, last_round)
                self.kept += len(picked.groups)
                self.filled += picked.filled
                if not picked.groups:
                    continue
                rows = torch.cat([torch.arange(g * n, (g + 1) * n) for g in picked.groups])
                data, indices = data[rows], [indices[int(r)] for r in rows]
            kept, out = self.recipe.advantages(self.cfg, data, generator)
            self.dock.put([indices[int(k)] for k in kept], out)
        metrics = {"reward/zero_adv_group_fraction": zero_groups / max(groups, 1),
                   "timing/advantage_s": time.perf_counter() - start}
        return RoundAdvantages(kept=self.kept, filled=self.filled, metrics=metrics)
