"""LoRA on FSDP2 (``model.lora`` with ``train.dp: 2``), on 2 gloo ranks: one step on each rank's half equals the
torch engine's step on the whole batch, the frozen base never changes, reference log-probs (the adapter off) are
the base model's, and the checkpoint holds the adapters only and round-trips. One start of the ranks."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from fixtures.ranks import start_ranks
from fixtures.tiny_models import tiny_qwen2
from test_fsdp_training import loss_fn, mini_batch
from test_lora import CLIP, LR, lora_model

from dockflow.engines import TorchTrainingEngine

WORLD = 2


def _rank(rank: int, store_path: str, out_dir: str) -> None:
    from dockflow.engines.fsdp_training import FSDPTrainingEngine

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD), rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    engine = FSDPTrainingEngine(lora_model(), lr=LR, grad_clip=CLIP, bucket_bytes=4096)
    share = mini_batch()[rank * 4:(rank + 1) * 4]
    reference = engine.infer_reference(share)
    metrics = engine.train_mini_batch(share, loss_fn, micro_batch_size=2)
    generation = {n: p.clone() for n, p in engine.generation_weights()}
    state = engine.state_dict()  # collective: complete on rank 0
    path = Path(out_dir) / "state.pt"
    if rank == 0:
        torch.save(state, path)
    dist.barrier()
    engine.load_state_dict(torch.load(path, weights_only=True))
    reloaded = {n: p.clone() for n, p in engine.generation_weights()}
    torch.save({"reference": reference, "metrics": metrics, "generation": generation, "state": state,
                "reloaded": reloaded}, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("lora_fsdp")
    start_ranks(_rank, (str(tmp / "store"), str(tmp)), WORLD)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


def test_a_dp2_lora_step_equals_the_dp1_step_and_keeps_the_base(ranks):
    single = TorchTrainingEngine(lora_model(), lr=LR, grad_clip=CLIP)
    base = {n: p.detach().clone() for n, p in single.model.named_parameters()}
    metrics = single.train_mini_batch(mini_batch(), loss_fn, micro_batch_size=2)
    after = dict(single.model.named_parameters())
    for r in ranks:
        assert r["metrics"]["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5)
        for name, weight in r["generation"].items():
            if ".lora_" in name:  # AdamW's first step on tiny grads: see test_fsdp_training
                torch.testing.assert_close(weight, after[name].detach(), rtol=0, atol=LR * 1e-2, msg=name)
            else:
                assert torch.equal(weight, base[name]), f"frozen {name} changed"


def test_dp2_reference_log_probs_are_the_base_models(ranks):
    base = TorchTrainingEngine(tiny_qwen2(40), lr=LR)  # what lora_model wraps
    mask = mini_batch()["response_mask"]
    got = torch.cat([r["reference"] for r in ranks])
    torch.testing.assert_close(got * mask, base.infer(mini_batch()) * mask, rtol=1e-5, atol=1e-6)


def test_the_dp2_checkpoint_holds_the_adapters_and_round_trips(ranks):
    state = ranks[0]["state"]
    adapters = {n for n, p in lora_model().named_parameters() if p.requires_grad}
    assert set(state["model"]) == adapters
    assert len(state["optimizer"]["state"]) == len(adapters)
    assert ranks[1]["state"]["model"] == {}  # the full state is rank 0's
    for r in ranks:
        for name, weight in r["generation"].items():
            assert torch.equal(r["reloaded"][name], weight), name
