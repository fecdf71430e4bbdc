"""The reward worker: verifies responses against reference answers, then computes GRPO advantages.

It holds no model, only the tokenizer (to decode) and the task's answers (looked up by the prompt id
that the dock carries as metadata). Light: it asks Ray for no CPU.
"""

from __future__ import annotations

import time

import torch
from tensordict import TensorDict

from dockflow.algos import grpo_advantages
from dockflow.config import Config
from dockflow.data import load_task
from dockflow.dock import TransferDock
from dockflow.engines import decode_responses
from dockflow.models import load_tokenizer
from dockflow.rewards import verify
from dockflow.workers.consume import consume


class RewardWorker:
    """Consumer states ``reward`` (writes ``rewards``) and ``advantage`` (writes ``advantages``)."""

    def __init__(self, cfg: Config, model_dir: str, dock: TransferDock):
        self.cfg = cfg
        self.dock = dock
        self.tokenizer = load_tokenizer(model_dir)
        self.answers = [ex.answer for ex in load_task(cfg.data, cfg.run.seed).train]

    def ready(self) -> bool:
        return True

    def compute_rewards(self, iteration: int) -> dict[str, float]:
        start = time.perf_counter()
        total = correct = 0.0
        values: list[float] = []
        bs = self.cfg.train.infer_batch_size
        for batch in consume(self.dock, "reward", ["responses", "response_mask"], self.cfg.global_batch, bs):
            texts = decode_responses(self.tokenizer, batch.data["responses"], batch.data["response_mask"])
            rewards = torch.tensor(
                [verify(t, self.answers[int(p)]) for t, p in zip(texts, batch.meta["prompt_id"], strict=True)],
                dtype=torch.float32,
            )
            self.dock.put(batch.indices, TensorDict({"rewards": rewards}, batch_size=[len(batch)]))
            values.extend(rewards.tolist())
            total += len(batch)
            correct += float((rewards > 0).sum())
        t = torch.tensor(values)
        return {
            "reward/mean": float(t.mean()),
            "reward/std": float(t.std()) if len(values) > 1 else 0.0,
            "timing/reward_s": time.perf_counter() - start,
        }

    def compute_advantages(self, iteration: int) -> dict[str, float]:
        start = time.perf_counter()
        n = self.cfg.rollout.group_size
        alg = self.cfg.algorithm
        bs = max(n, (self.cfg.train.infer_batch_size // n) * n)
        zero_groups = groups = 0
        for batch in consume(self.dock, "advantage", ["rewards"], self.cfg.global_batch, bs, whole_groups=True):
            rewards = batch.data["rewards"]
            adv = grpo_advantages(rewards, n, alg.norm_adv_by_std, alg.adv_eps)
            self.dock.put(batch.indices, TensorDict({"advantages": adv}, batch_size=[len(batch)]))
            grouped = rewards.view(-1, n)
            groups += grouped.shape[0]
            zero_groups += int((grouped.max(1).values == grouped.min(1).values).sum())
        return {"reward/zero_adv_group_fraction": zero_groups / max(groups, 1), "timing/advantage_s": time.perf_counter() - start}
