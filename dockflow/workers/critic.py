"""The critic worker (PPO, PF-PPO): a value head on the policy's architecture, started from its weights.

States: ``critic_infer`` writes ``values`` for each rollout; ``critic_update`` regresses the values on the
``returns`` the advantage state wrote, with PPO's clipped value loss.
"""

from __future__ import annotations

import time

import torch
from tensordict import TensorDict

from dockflow.algos import clipped_value_loss
from dockflow.algos.recipe import CriticSection
from dockflow.config import Config
from dockflow.dock import DockRequest, TransferDock
from dockflow.engines import EngineInputs, create_critic_engine
from dockflow.models import load_critic
from dockflow.storage.objects import fetch_model
from dockflow.workers.consume import consume
from dockflow.workers.runtime import ModelWorker
from dockflow.workers.training import length_sorted, train_epochs


class CriticWorker(ModelWorker):
    """Value model plus its optimizer; reads and writes the dock like every worker."""

    part = "critic"

    def __init__(self, cfg: Config, model_dir: str, dock: TransferDock):
        super().__init__(cfg, dock)
        self.columns = cfg.plan.role("critic").reads  # its states' dock columns
        self.section = cfg.plan.section("critic", CriticSection)  # the algorithm's critic settings
        inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed)
        model = load_critic(fetch_model(model_dir, cfg.checkpoint), dtype=cfg.model.dtype)
        self.engine = create_critic_engine(inputs, self.section, model)

    def ready(self) -> bool:
        return True

    def compute_values(self, iteration: int) -> dict[str, float]:
        start = time.perf_counter()
        bs = self.cfg.train.infer_batch_size
        request = DockRequest("critic_infer", bs, self.columns["critic_infer"], window=self.cfg.dock_window(iteration))
        for batch in consume(self.dock, request, self.cfg.global_batch):
            values = self.engine.infer(batch.data)
            self.dock.put(batch.indices, TensorDict({"values": values}, batch_size=[len(batch)]))
        return {"timing/values_s": time.perf_counter() - start}

    def _loss(self, values: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        loss, clip_fraction = clipped_value_loss(
            values,
            micro["values"],
            micro["returns"],
            micro["response_mask"],
            self.section.value_clip,
            token_denom=tokens,
        )
        mask = micro["response_mask"].bool()
        explained = float((values.detach()[mask] - micro["returns"][mask]).square().mean()) if mask.any() else 0.0
        metrics = {
            "critic/value_loss": float(loss.detach()) * tokens / max(float(mask.sum()), 1.0),
            "critic/clip_fraction": float(clip_fraction),
            "critic/value_mse": explained,
        }
        return loss, metrics

    def update(self, iteration: int) -> dict[str, float]:
        start = time.perf_counter()
        tc = self.cfg.train
        request = DockRequest("critic_update", tc.mini_batch_size, self.columns["critic_update"],
                              window=self.cfg.dock_window(iteration))
        batches = consume(self.dock, request, self.cfg.train_batch)
        mini_batches = (length_sorted(b.data, tc.micro_batch_size) if tc.seqlen_balance else b.data for b in batches)
        metrics = train_epochs(self.engine, mini_batches, self._loss, tc.epochs, tc.micro_batch_size)
        metrics.pop("train/dp_load_imbalance", None)  # the critic trains on one process
        out = {k if k.startswith("critic/") else f"critic/{k.removeprefix('train/')}": v for k, v in metrics.items()}
        out["timing/critic_update_s"] = time.perf_counter() - start
        return out
