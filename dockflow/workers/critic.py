"""The critic worker (PPO, PF-PPO): a value head on the policy's architecture, started from its weights.

States: ``critic_infer`` writes ``values`` for each rollout; ``critic_update`` regresses the values on the
``returns`` the advantage state wrote, with PPO's clipped value loss. With ``train.engine: megatron`` there are
tp x pp critic workers, megatron ranks of one value model in a process group of their own: rank 0 reads the dock,
passes every batch to the others (``model_parallel``) and alone writes ``values`` and reports metrics.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TypeVar

import torch
from tensordict import TensorDict

from dockflow.algos.plan import RunPlan
from dockflow.algos.ppo import clipped_value_loss
from dockflow.config import Config
from dockflow.config.algorithm import CriticSection
from dockflow.dock import DockRequest, TransferDock
from dockflow.engines import EngineInputs, create_critic_engine
from dockflow.engines.devices import process_group_backend
from dockflow.models import load_critic
from dockflow.storage.objects import fetch_model
from dockflow.workers.consume import consume, fill_column
from dockflow.workers.dp_group import join_dp_group
from dockflow.workers.model_parallel import ModelReplica, shared_stream
from dockflow.workers.runtime import ModelWorker
from dockflow.workers.update_loop import length_sorted, train_epochs

T = TypeVar("T")


class CriticWorker(ModelWorker):
    """Value model plus its optimizer; reads and writes the dock like every worker."""

    part = "critic"

    def __init__(self, cfg: Config, plan: RunPlan, model_dir: str, dock: TransferDock, rank: int = 0, group_key: str = ""):
        """``rank`` of ``train.critic_ranks``; with megatron the ranks first join one process group, found under
        ``group_key`` (``dp_group``)."""
        super().__init__(cfg, dock, cfg.train.critic_ranks)
        self.plan = plan  # the run plan, built once by the driver
        self.rank, world = rank, cfg.train.critic_ranks
        if cfg.train.engine == "megatron":  # megatron's parallel state needs a group, even of one rank
            join_dp_group(rank, world, group_key, cfg.ray.init_timeout_s, cfg.train.stage_timeout_s,
                          backend=process_group_backend(cfg.engine.device), role="critic")
        # one replica of a tp x pp value model (a torch critic: one rank): rank 0 reads the dock for it
        self.replica = ModelReplica(rank, cfg.train.tp, cfg.train.pp) if world > 1 else ModelReplica(rank)
        self.reads_dock = self.replica.reads_dock
        self.columns = plan.role("critic").reads  # its states' dock columns
        self.section = plan.section("critic", CriticSection)  # the algorithm's critic settings
        inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed)
        model = load_critic(fetch_model(model_dir, cfg.checkpoint), dtype=cfg.model.dtype)
        self.engine = create_critic_engine(inputs, self.section, model)

    def ready(self) -> bool:
        return True

    def compute_values(self, iteration: int) -> dict[str, float]:
        bs = self.cfg.train.infer_batch_size
        request = DockRequest("critic_infer", bs, self.columns["critic_infer"], window=self.plan.dock_window(iteration))
        batches = consume(self.dock, request, self.cfg.global_batch) if self.reads_dock else None
        seconds = fill_column(self.dock, self._shared(batches), "values", lambda batch: self.engine.infer(batch.data),
                              writes=self.reads_dock)
        return {"timing/values_s": seconds} if self.reads_dock else {}

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
                              window=self.plan.dock_window(iteration))
        mini_batches = None
        if self.reads_dock:
            batches = consume(self.dock, request, self.plan.train_batch)
            mini_batches = (length_sorted(b.data, tc.micro_batch_size) if tc.seqlen_balance else b.data
                            for b in batches)
        metrics = train_epochs(self.engine, self._shared(mini_batches), self._loss, tc.epochs, tc.micro_batch_size)
        if not self.reads_dock:  # rank 0 reports the update (its ranks hold one model)
            return {}
        metrics.pop("train/dp_load_imbalance", None)  # the critic is not data-parallel
        out = {k if k.startswith("critic/") else f"critic/{k.removeprefix('train/')}": v for k, v in metrics.items()}
        out["timing/critic_update_s"] = time.perf_counter() - start
        return out

    def _shared(self, items: Iterable[T] | None) -> Iterable[T]:
        """``items`` as they are (one rank), or megatron's ranks: rank 0's, passed to every rank."""
        if not self.replica.shares_batches:
            assert items is not None
            return items
        return shared_stream(items, self.reads_dock)
