"""The pair source (offline algorithms: DPO): puts each iteration's preference pairs into the dock.

It holds no model, only the tokenizer and the pairs (``data/preferences.py``: a JSONL file, local or s3://, or
pairs built from the task). Its "generation" writes a pair's chosen response at an even dock index and the
rejected one at the next; the reference and actor workers read them from there like rollouts. It also hands
the held-out pairs, encoded, to the actor's evaluation (the policy's preference margin). Light: no CPU.
"""

from __future__ import annotations

import time

import torch
from tensordict import TensorDict

from dockflow.algos.plan import RunPlan
from dockflow.background import run_in_background
from dockflow.config import Config
from dockflow.config.algorithm import PreferenceSection
from dockflow.data import PromptFormat, load_task
from dockflow.data.preferences import PreferencePair, preference_splits
from dockflow.dock import TransferDock
from dockflow.engines import encode_rollouts
from dockflow.models import load_tokenizer
from dockflow.rollout.plain import clipped_rows, rollout_metrics
from dockflow.storage.objects import fetch_model


class PairSource:
    """``put_pairs`` (the generate state of an offline algorithm) and ``eval_pairs``."""

    def __init__(self, cfg: Config, plan: RunPlan, model_dir: str, dock: TransferDock) -> None:
        self.plan = plan  # the run plan, built once by the driver
        run_in_background()  # a light actor (num_cpus=0): dockflow/background.py
        self.cfg, self.dock = cfg, dock
        self.tokenizer = load_tokenizer(fetch_model(model_dir, cfg.checkpoint))
        task = load_task(cfg.data, cfg.run.seed, storage=cfg.checkpoint)
        self.writes = plan.role("pairs").writes  # the rollout columns
        section = plan.section("pairs", PreferenceSection)
        self.pairs, self.held_out = preference_splits(section, task, cfg.run.seed, cfg.checkpoint)

    def ready(self) -> bool:
        return True

    def encode(self, pairs: list[PreferencePair]) -> TensorDict:
        """Rows chosen, rejected, chosen, ... in the rollout layout (prompt + response, masks, lengths)."""
        fmt = PromptFormat.of(self.cfg.data)
        prompts = [fmt.render(p.prompt, self.tokenizer) for p in pairs for _ in range(2)]
        responses = [r for p in pairs for r in (p.chosen, p.rejected)]
        return encode_rollouts(self.tokenizer, prompts, responses, self.cfg.rollout.max_new_tokens)

    def put_pairs(self, iteration: int, pair_ids: list[int]) -> dict[str, float]:
        """The iteration's pairs into its dock window: pair k's chosen at 2k, rejected at 2k + 1."""
        start = time.perf_counter()
        out = self.encode([self.pairs[i] for i in pair_ids])
        meta = {"prompt_id": torch.tensor(pair_ids).repeat_interleave(2), "response_length": out["response_length"]}
        lo = self.plan.dock_window(iteration)[0]
        self.dock.put(list(range(lo, lo + len(out))), out.select(*self.writes), meta)
        return rollout_metrics(int(out["prompt_length"].sum()), int(out["response_length"].sum()), len(out), start,
                               clipped_rows(out))

    def eval_pairs(self) -> TensorDict:
        """The held-out pairs, encoded, for the actor's preference margin."""
        return self.encode(self.held_out)
