"""The reward worker: verifies responses against reference answers, then computes advantages.

It holds no model, only the tokenizer (to decode) and the task's answers (looked up by the prompt id
that the dock carries as metadata). Light: it asks Ray for no CPU. The algorithm's recipe shapes the rewards
(DAPO: overlong responses) and estimates the advantages; under dynamic sampling (``rounds > 1``) only groups
whose rewards differ get advantages, so the update consumes informative groups only.
"""

from __future__ import annotations

import time

import torch
from tensordict import TensorDict

from dockflow.algos import informative_groups
from dockflow.config import Config
from dockflow.data import load_task
from dockflow.dock import DockRequest, TransferDock
from dockflow.engines import decode_responses
from dockflow.models import load_tokenizer
from dockflow.rewards import verify
from dockflow.storage.objects import fetch_model
from dockflow.workers.columns import consumers
from dockflow.workers.consume import consume


def filtration_seed(run_seed: int, iteration: int) -> int:
    """Seed of PF-PPO's reward-weighted sampling in one iteration (resume-stable)."""
    return (run_seed * 7_919 + iteration * 104_729) % 2**62


class RewardWorker:
    """Consumer states ``reward`` (writes ``rewards``) and ``advantage`` (writes ``advantages``, ``returns``)."""

    def __init__(self, cfg: Config, model_dir: str, dock: TransferDock):
        self.cfg = cfg
        self.dock = dock
        self.tokenizer = load_tokenizer(fetch_model(model_dir, cfg.checkpoint))
        self.answers = [ex.answer for ex in load_task(cfg.data, cfg.run.seed, storage=cfg.checkpoint).train]
        self.advantage_columns = consumers(cfg)["advantage"]
        self.kept_groups = 0  # groups given advantages in this iteration (dynamic sampling's quota)
        self.recipe = cfg.algorithm.recipe  # the algorithm: reward shaping, advantage estimator

    def ready(self) -> bool:
        return True

    def compute_rewards(self, iteration: int) -> dict[str, float]:
        """Score one generation round (G x N samples) into ``rewards``."""
        start = time.perf_counter()
        values: list[float] = []
        correct = 0.0
        bs = self.cfg.train.infer_batch_size
        request = DockRequest("reward", bs, ("responses", "response_mask"), window=self.cfg.dock_window(iteration))
        for batch in consume(self.dock, request, self.cfg.global_batch):
            texts = decode_responses(self.tokenizer, batch.data["responses"], batch.data["response_mask"])
            score = torch.tensor(
                [verify(t, self.answers[int(p)]) for t, p in zip(texts, batch.meta["prompt_id"], strict=True)],
                dtype=torch.float32,
            )
            correct += float((score > 0).sum())
            score = self.recipe.shape_rewards(self.cfg, score, batch.meta["response_length"])  # DAPO: overlong shaping
            self.dock.put(batch.indices, TensorDict({"rewards": score}, batch_size=[len(batch)]))
            values.extend(score.tolist())
        t = torch.tensor(values)
        return {
            "reward/mean": float(t.mean()),
            "reward/std": float(t.std()) if len(values) > 1 else 0.0,
            "reward/correct_fraction": correct / len(values),
            "timing/reward_s": time.perf_counter() - start,
        }

    def compute_advantages(self, iteration: int, round_index: int = 0, last_round: bool = True) -> dict[str, float]:
        """Advantages of one generation round. Under dynamic sampling, groups with equal rewards are skipped
        until the iteration has G groups; the last round fills what is still missing with any groups."""
        start = time.perf_counter()
        if round_index == 0:
            self.kept_groups = 0
        n = self.cfg.rollout.group_size
        quota = self.cfg.rollout.prompts_per_iter
        dynamic = self.cfg.rounds > 1
        generator = torch.Generator().manual_seed(filtration_seed(self.cfg.run.seed, iteration))
        zero_groups = groups = filled = 0
        request = DockRequest("advantage", self.recipe.advantage_batch_size(self.cfg), tuple(self.advantage_columns),
                              whole_groups=True, window=self.cfg.dock_window(iteration))
        batches = consume(self.dock, request, self.cfg.global_batch)
        for batch in batches:
            data = batch.data
            informative = informative_groups(data["rewards"], n)
            groups += len(informative)
            zero_groups += int((~informative).sum())
            if dynamic:
                # Informative groups first, then (last round only) uninformative ones to fill the batch.
                order = [g for g in range(len(informative)) if informative[g]]
                if last_round:
                    order += [g for g in range(len(informative)) if not informative[g]]
                take = sorted(order[: max(0, quota - self.kept_groups)])
                filled += sum(1 for g in take if not informative[g])
                self.kept_groups += len(take)
                if not take:
                    continue
                rows = torch.cat([torch.arange(g * n, (g + 1) * n) for g in take])
                data = data[rows]
                indices = [batch.indices[int(r)] for r in rows]
            else:
                indices = batch.indices
            kept, out = self.recipe.advantages(self.cfg, data, generator)
            self.dock.put([indices[int(k)] for k in kept], out)
        metrics = {
            "reward/zero_adv_group_fraction": zero_groups / max(groups, 1),
            "timing/advantage_s": time.perf_counter() - start,
        }
        if dynamic:
            metrics.update({"dapo/kept_groups": float(self.kept_groups), "dapo/filled_groups": float(filled)})
        return metrics
