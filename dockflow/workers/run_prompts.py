"""The run's prompt order: the ``PromptSampler`` of a config (``dockflow.data.prompt_order``), shared by the
session (which prompts each iteration generates) and the rollout queue (the next iteration's prompts)."""

from __future__ import annotations

import hashlib

from dockflow.config import Config
from dockflow.data.prompt_order import PromptSampler


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
