"""A LoRA policy's checkpoint (``model.lora``), local and on S3, through the worker's own save and load: the adapters
and their AdamW state only, and a run resumed from it ends bit-identical to one that was never interrupted
(adapter dropout on, so the restored RNG state matters too)."""

from __future__ import annotations

import torch
from fixtures.engine_batches import grpo_loss, rollout_batch, with_old_log_probs
from fixtures.tiny_models import tiny_qwen2

from dockflow.config import LoraConfig
from dockflow.engines import TorchTrainingEngine
from dockflow.engines.lora import with_lora
from dockflow.workers.runtime import ModelWorker

LORA = LoraConfig(rank=4, alpha=8.0, dropout=0.1, target_modules=["q_proj", "v_proj", "up_proj"])


class Policy(ModelWorker):
    """The checkpoint part of an actor: its engine, the RNG states (no Ray, no dock)."""

    part = "actor"

    def __init__(self, seed: int) -> None:
        self.engine = TorchTrainingEngine(with_lora(tiny_qwen2(40), LORA, seed=seed), lr=1e-2, grad_clip=0.5)

    def step(self) -> None:
        batch = rollout_batch()
        self.engine.train_mini_batch(with_old_log_probs(batch, self.engine.infer(batch)), grpo_loss(), 2)


def test_a_resumed_lora_run_equals_an_uninterrupted_one(make_store):
    torch.manual_seed(7)
    full = Policy(seed=0)
    full.step()
    store = make_store()
    full.save(store, 1)  # the interrupted run's checkpoint after its first step
    store.commit(1, {"iteration": 1})
    full.step()

    part = store.read_part(1, "actor")["engine"]
    assert part["model"] and all(".lora_" in name for name in part["model"])  # no base weight is saved
    adapters = {n for n, p in full.engine.model.named_parameters() if p.requires_grad}
    assert set(part["model"]) == adapters and len(part["optimizer"]["state"]) == len(adapters)

    resumed = Policy(seed=1)  # other initial adapters: only the checkpoint can make it equal
    resumed.load(make_store(), store.latest())
    resumed.step()
    want = full.engine.state_dict()
    got = resumed.engine.state_dict()
    for name, value in want["model"].items():
        assert torch.equal(got["model"][name], value), f"{name} differs after resume"
    for key, state in want["optimizer"]["state"].items():
        for k, v in state.items():
            assert torch.equal(got["optimizer"]["state"][key][k], v), f"optimizer {key}.{k} differs"
    base = dict(full.engine.model.named_parameters())
    assert all(torch.equal(p, base[n]) for n, p in resumed.engine.model.named_parameters())
