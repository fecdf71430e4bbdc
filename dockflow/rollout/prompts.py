"""The run's prompts: their order, the ``PromptSampler`` of a config (``dockflow.data.prompt_order``), shared by the
session (which prompts each iteration generates) and the rollout queue (the next iteration's prompts); the train
prompts the length policy leaves out; and each worker's ``PromptTable`` (the prompts formatted, one width)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING

from dockflow.algos.plan import RunPlan
from dockflow.config import Config
from dockflow.data.length_policy import LengthPolicyError, check_prompt_lengths
from dockflow.data.prompt_order import PromptSampler

if TYPE_CHECKING:
    from dockflow.engines import GenerationEngine

log = logging.getLogger(__name__)


def iteration_sampler(cfg: Config, plan: RunPlan, excluded: Sequence[int] = ()) -> PromptSampler:
    """The run's sampler: G prompts (x the run ``plan``'s sampling rounds) per iteration from the train split less the
    ``excluded`` ones (:func:`overlong_train_prompts`), or the pair source's train pairs, in the order of
    ``shuffle_seed(cfg)``."""
    from dockflow.config.algorithm import PreferenceSection
    from dockflow.data import load_task
    from dockflow.data.preferences import preference_splits

    task = load_task(cfg.data, cfg.run.seed, storage=cfg.checkpoint)
    if plan.has("pairs"):  # it trains on preference pairs
        pairs = plan.section("pairs", PreferenceSection)
        count = len(preference_splits(pairs, task, cfg.run.seed, cfg.checkpoint)[0])
    else:
        count = len(task.train)
    return PromptSampler(count, cfg.rollout.prompts_per_iter * plan.sampling.rounds, shuffle_seed(cfg), excluded)


def shuffle_seed(cfg: Config) -> int:
    """``data.shuffle_seed``; when null, ``run.seed``, except for a run that continues from a registered model:
    then one derived from the run's name, so each recurring run (named after its KFP run) draws the prompts in
    another order, and a resumed run in the same one."""
    if cfg.data.shuffle_seed is not None:
        return cfg.data.shuffle_seed
    if cfg.model.continue_from == "base":
        return cfg.run.seed
    return int(hashlib.sha256(f"{cfg.run.seed}:{cfg.run.name}".encode()).hexdigest()[:8], 16)


def overlong_train_prompts(cfg: Config, model_dir: str) -> list[int]:
    """The train prompts the run leaves out (``data.overlong_prompts=filter``), from the model's tokenizer; logged
    with their count. Without a filter none, and nothing is loaded."""
    if cfg.data.max_prompt_tokens is None or cfg.data.overlong_prompts != "filter":
        return []
    if cfg.offline:
        raise LengthPolicyError(f"data.overlong_prompts=filter leaves prompts out of sampling; algorithm.name="
                                f"{cfg.algorithm.name} trains on preference pairs: set data.overlong_prompts=refuse")
    from dockflow.data import PromptFormat, load_task
    from dockflow.models.factory import load_tokenizer
    from dockflow.storage.objects import fetch_model

    tokenizer = load_tokenizer(fetch_model(model_dir, cfg.checkpoint))
    prompts = [ex.prompt for ex in load_task(cfg.data, cfg.run.seed, storage=cfg.checkpoint).train]
    over = check_prompt_lengths(PromptFormat.of(cfg.data).render_all(prompts, tokenizer), tokenizer, cfg.data,
                                cfg.rollout.max_new_tokens, None)
    log.warning("data.overlong_prompts=filter: %d of %d train prompts are over data.max_prompt_tokens=%d and are "
                "left out", len(over), len(prompts), cfg.data.max_prompt_tokens)
    return over


class PromptTable:
    """The train prompts, formatted (``PromptFormat``), and one prompt width for the run, measured at first use.
    The dock fixes a column's per-sample shape until it is fully reset, and parked groups join later iterations,
    so every rollout is padded alike. One per worker."""

    def __init__(self, templated: list[str], engine: GenerationEngine) -> None:
        self.templated = templated
        self._engine = engine

    @cached_property
    def width(self) -> int:
        return self._engine.prompt_width(self.templated)
