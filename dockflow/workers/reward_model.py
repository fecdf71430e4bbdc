"""The reward-model worker: scores each rollout with every ``reward.models`` entry, into ``rm_scores``.

Consumer state ``reward_model``: reads the rollout columns, decodes the response with the policy's tokenizer,
scores the pairs with each reward model (``dockflow.rewards.sequence_classifier``) and writes ``rm_scores`` ``[B, M]``
(raw scores, M in the config's order). A reward model with a chat template reads the task's own prompt (looked
up by the dock's ``prompt_id``) in its template, after ``data.system_prompt``: never the policy's chat markup
wrapped again. One without reads the prompt as the policy saw it (decoded), then the response. The reward
worker weighs the scores into the combined reward. The models are frozen, so a checkpoint holds nothing of this
worker. Placement: ``reward.model_cpus`` / ``reward.model_devices`` (> 0: on ``engine.device``'s accelerator,
checked as every model worker checks its own).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from dockflow.algos.plan import REWARD_MODEL_CONSUMER, RunPlan
from dockflow.config import Config
from dockflow.data import load_task
from dockflow.dock import DockBatch, DockRequest, TransferDock
from dockflow.engines import decode_responses
from dockflow.engines.devices import check_worker_device
from dockflow.models import load_tokenizer
from dockflow.rewards.sequence_classifier import RewardModel
from dockflow.storage.objects import fetch_model
from dockflow.workers.consume import consume, fill_column
from dockflow.workers.runtime import init_worker_process


def split_prompts(data: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
    """The left-padded prompt part of ``input_ids`` and its mask (the rollout layout puts responses last)."""
    width = data["input_ids"].shape[1] - data["responses"].shape[1]
    return data["input_ids"][:, :width], data["attention_mask"][:, :width]


class RewardModelWorker:
    """Holds every reward model of the run on one device; reads and writes the dock like every worker."""

    def __init__(self, cfg: Config, plan: RunPlan, model_dir: str, dock: TransferDock):
        self.plan = plan  # the run plan, built once by the driver
        init_worker_process(cfg.ray, cfg.run.seed)
        self.cfg = cfg
        self.dock = dock
        self.tokenizer = load_tokenizer(fetch_model(model_dir, cfg.checkpoint))  # the policy's, to decode
        device = check_worker_device(cfg.engine.device) if cfg.reward.model_devices > 0 else torch.device("cpu")
        self.models = [
            RewardModel(m.path, cfg.checkpoint, device=device, batch_size=cfg.reward.model_batch_size,
                        dtype=cfg.model.dtype, system_prompt=cfg.data.system_prompt)
            for m in cfg.reward.models
        ]
        any_chat = any(rm.chat for rm in self.models)
        self.examples = load_task(cfg.data, cfg.run.seed, storage=cfg.checkpoint).train if any_chat else []
        self.columns = plan.role("reward_model").reads[REWARD_MODEL_CONSUMER]

    def ready(self) -> bool:
        return True

    def score(self, iteration: int) -> dict[str, float]:
        """Score one generation round (G x N samples) into ``rm_scores``."""
        request = DockRequest(REWARD_MODEL_CONSUMER, self.cfg.train.infer_batch_size, self.columns,
                              window=self.plan.dock_window(iteration))
        seconds = fill_column(self.dock, consume(self.dock, request, self.cfg.global_batch), "rm_scores", self._scores)
        return {"timing/reward_model_s": seconds}

    def _scores(self, batch: DockBatch) -> torch.Tensor:
        """Every reward model's score of each sample of ``batch`` ([B, models])."""
        as_seen = decode_responses(self.tokenizer, *split_prompts(batch.data))
        own = [self.examples[int(p)].prompt for p in batch.meta["prompt_id"]] if self.examples else []
        responses = decode_responses(self.tokenizer, batch.data["responses"], batch.data["response_mask"])
        scores = [rm.score(own if rm.chat else as_seen, responses) for rm in self.models]
        return torch.tensor(scores, dtype=torch.float32).T.contiguous()
