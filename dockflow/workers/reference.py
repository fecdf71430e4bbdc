"""The reference worker: a frozen copy of the starting policy that scores responses for the KL penalty."""

from __future__ import annotations

from dockflow.algos.plan import RunPlan
from dockflow.config import Config
from dockflow.dock import DockRequest, TransferDock
from dockflow.engines import batched_log_probs, check_worker_device
from dockflow.engines.routing import RouterReplay
from dockflow.models import load_model_and_tokenizer
from dockflow.storage.objects import fetch_model
from dockflow.workers.consume import consume, fill_column
from dockflow.workers.runtime import init_worker_process


class ReferenceWorker:
    """Reads rollouts from the dock, writes ``ref_log_prob``."""

    def __init__(self, cfg: Config, plan: RunPlan, model_dir: str, dock: TransferDock):
        self.plan = plan  # the run plan, built once by the driver
        init_worker_process(cfg.ray, cfg.run.seed)
        self.cfg = cfg
        self.dock = dock
        self.columns = plan.role("reference").reads["ref_infer"]
        self.model, _ = load_model_and_tokenizer(fetch_model(model_dir, cfg.checkpoint), dtype=cfg.model.dtype)
        self.model.requires_grad_(False).to(check_worker_device(cfg.engine.device))  # engine.device, checked
        # train.router_replay: replay: an MoE reference scores with the rollout's recorded experts too
        self.router = RouterReplay.attach(self.model, replay=True) if "routed_experts" in self.columns else None

    def ready(self) -> bool:
        return True

    def compute_ref_log_prob(self, iteration: int) -> dict[str, float]:
        """The reference policy's log-probs of the iteration's responses, into ``ref_log_prob``."""
        bs = self.cfg.train.infer_batch_size
        request = DockRequest("ref_infer", bs, self.columns, window=self.plan.dock_window(iteration))
        seconds = fill_column(self.dock, consume(self.dock, request, self.cfg.global_batch), "ref_log_prob",
                              lambda batch: batched_log_probs(self.model, batch.data, bs, self.cfg.rollout.temperature,
                                                              self.router))
        return {"timing/ref_log_prob_s": seconds}
