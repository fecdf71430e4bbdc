"""Megatron checkpoints (``dockflow.engines.megatron.checkpoint``) on two gloo ranks, in one launch.

At TP=2 a tiny tied Qwen2 takes two AdamW steps; the checkpoint of step 1 goes to a local checkpoint store and
to an S3 one (moto on loopback). Then: a save whose commit is interrupted leaves step 1 the latest (and a later
save of that step commits); a fresh model and optimizer at TP=2 loaded from it take the same second step bit for
bit; at TP=1 (the two ranks as data parallel, from S3) and at PP=2 (local) the loaded weights and optimizer state,
gathered, equal the TP=2 ones exactly, and so do they through saves at PP=2 and at TP=1 x DP=2; the weights load
alone too.

megatron is imported once, in the fork server the ranks start from (``tests/fixtures/ranks.py``).
"""

from __future__ import annotations

import os
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from fixtures.ranks import start_ranks
from fixtures.tiny_models import tiny_decoder

from dockflow.config import CheckpointConfig
from dockflow.engines.megatron.convert import hf_to_megatron, spec_from_hf
from dockflow.storage import CheckpointError, LocalCheckpointStore, S3CheckpointStore
from dockflow.storage.s3 import S3Options

RESPONSE = 5
NAME = "qwen2_tied"  # tied: at PP=2 the last stage holds a replica of the embedding, and its optimizer state


def rollout() -> tuple[torch.Tensor, torch.Tensor]:
    """4 rows of prompt 6 + response 5, the first and third left-padded, responses of lengths 5, 3, 1, 5."""
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 40, (4, 6 + RESPONSE), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[2, :4] = 0
    for row, length in enumerate([5, 3, 1, 5]):
        mask[row, 6 + length :] = 0
    return ids, mask


def _build(tp: int, pp: int):
    """A fresh model (the HF weights), its spec and AdamW over its local shards, at TP x PP."""
    from dockflow.engines.megatron import model as mg

    mg.destroy_model_parallel()  # a no-op the first time
    mg.init_model_parallel(tp=tp, pp=pp, seed=0, device="cpu")
    hf = tiny_decoder(NAME)
    spec = spec_from_hf(hf.config)
    model = mg.build_gpt_model(spec, tp=tp, pp=pp)
    mg.load_full_state(model, hf_to_megatron(hf.state_dict(), spec), spec)
    model.train()
    return model, spec, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def _train_step(model, spec, optimizer) -> None:
    from dockflow.engines.megatron.schedule import finalize_grads, pipeline_forward_backward

    ids, mask = rollout()
    optimizer.zero_grad(set_to_none=True)
    pipeline_forward_backward(
        model,
        ids,
        mask,
        RESPONSE,
        spec.vocab_size,
        micro_batch_size=2,
        loss_fn=lambda outputs, rows: -(outputs.values * mask[rows][:, -RESPONSE:]).sum(),
    )
    finalize_grads(model, spec)
    optimizer.step()


def _gathered(model, spec, optimizer) -> dict:
    """Full weights and optimizer state (exp_avg, exp_avg_sq, step) gathered from every rank's shards."""
    from dockflow.engines.megatron import model as mg

    named = dict(model.named_parameters())
    out = {"weights": mg.gather_full_state(model, spec)}
    for key in ("exp_avg", "exp_avg_sq"):
        out[key] = mg.gather_full({n: optimizer.state[p][key] for n, p in named.items()}, spec)
    out["steps"] = sorted({float(optimizer.state[p]["step"]) for p in named.values()})
    out["lr"] = optimizer.param_groups[0]["lr"]
    return out


def _interrupted_save(store, model, optimizer) -> str:
    """Save step 2 with rank 0's commit failing (a crash between the parts and the manifest)."""
    from dockflow.engines.megatron.checkpoint import save_checkpoint

    def crash(*args, **kwargs):
        raise CheckpointError("killed before the manifest")

    if dist.get_rank() == 0:
        store.commit = crash
    try:
        save_checkpoint(store, 2, model, optimizer, {"iteration": 2})
    except CheckpointError as exc:
        return str(exc)
    finally:
        store.__dict__.pop("commit", None)
    return "no error"


def _rank(rank: int, store_path: str, out_dir: str, s3: tuple[str, dict[str, str]]) -> None:
    from dockflow.engines.megatron import model as mg
    from dockflow.engines.megatron.checkpoint import load_checkpoint, save_checkpoint

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    store = LocalCheckpointStore(Path(out_dir) / "ckpt", keep=4)
    os.environ.update(s3[1])
    s3_store = S3CheckpointStore(s3[0], keep=3, options=S3Options.from_config(CheckpointConfig()))
    result: dict = {}
    model, spec, optimizer = _build(2, 1)
    _train_step(model, spec, optimizer)
    save_checkpoint(store, 1, model, optimizer, {"iteration": 1})
    save_checkpoint(s3_store, 1, model, optimizer, {"iteration": 1})
    result["saved"] = _gathered(model, spec, optimizer)
    _train_step(model, spec, optimizer)
    result["uninterrupted"] = _gathered(model, spec, optimizer)
    result["interrupted_error"] = _interrupted_save(store, model, optimizer)
    result["latest"], result["uncommitted"] = store.latest(), store.list_uncommitted()

    model, spec, optimizer = _build(2, 1)  # resume at the same layout, from fresh objects
    result["saved_layout"] = load_checkpoint(store, result["latest"], model, optimizer)
    result["resumed_loaded"] = _gathered(model, spec, optimizer)
    _train_step(model, spec, optimizer)
    result["resumed"] = _gathered(model, spec, optimizer)
    save_checkpoint(store, 2, model, optimizer, {"iteration": 2})  # over the interrupted save's leftovers
    result["latest_after_resave"] = store.latest()
    for tp, pp, source in [(1, 1, s3_store), (1, 2, store)]:
        model, spec, optimizer = _build(tp, pp)
        load_checkpoint(source, 1, model, optimizer)
        result[f"tp{tp}pp{pp}"] = _gathered(model, spec, optimizer)
    save_checkpoint(store, 3, model, optimizer, {"iteration": 1})  # saved again from PP=2, loaded at TP=1
    model, spec, optimizer = _build(1, 1)
    result["pp2_layout"] = load_checkpoint(store, 3, model, optimizer)
    result["tp1_from_pp2"] = _gathered(model, spec, optimizer)
    save_checkpoint(store, 4, model, optimizer, {"iteration": 1})  # from TP=1 x DP=2 (replicas), back to TP=2
    model, spec, optimizer = _build(2, 1)
    load_checkpoint(store, 4, model, optimizer)
    result["tp2_from_dp2"] = _gathered(model, spec, optimizer)
    model, spec, _ = _build(1, 2)
    load_checkpoint(store, 1, model, None)  # the weights alone (for inference or export)
    result["weights_only"] = mg.gather_full_state(model, spec)
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    mg.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, s3_server) -> list[dict]:
    tmp = tmp_path_factory.mktemp("megatron_ckpt")
    s3 = (f"s3://{s3_server.BUCKET}/megatron-ckpt-{uuid.uuid4().hex[:8]}", s3_server.env())
    start_ranks(_rank, (str(tmp / "store"), str(tmp), s3), 2)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _assert_equal(got: dict, expected: dict) -> None:
    for part in ("weights", "exp_avg", "exp_avg_sq"):
        assert got[part].keys() == expected[part].keys(), part
        for key, tensor in expected[part].items():
            assert torch.equal(got[part][key], tensor), f"{part} {key}"
    assert got["steps"] == expected["steps"] and got["lr"] == expected["lr"]


def test_resume_at_the_same_layout_takes_the_uninterrupted_step_bit_for_bit(ranks):
    for r in ranks:
        assert r["saved_layout"] == {"tp": 2, "pp": 1, "world": 2}
        _assert_equal(r["resumed_loaded"], r["saved"])
        _assert_equal(r["resumed"], r["uninterrupted"])
        assert r["saved"]["steps"] == [1.0] and r["resumed"]["steps"] == [2.0]
        assert not torch.equal(
            r["saved"]["weights"]["embedding.word_embeddings.weight"],
            r["resumed"]["weights"]["embedding.word_embeddings.weight"],
        )  # the step moved it


LAYOUTS = {
    "tp2_to_tp1_from_s3": "tp1pp1",
    "tp2_to_pp2": "tp1pp2",
    "tp2_to_pp2_to_tp1": "tp1_from_pp2",
    "tp2_to_pp2_to_dp2_to_tp2": "tp2_from_dp2",
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_checkpoint_saved_at_tp2_loads_at_another_layout_exactly(ranks, layout):
    key = LAYOUTS[layout]
    for r in ranks:
        _assert_equal(r[key], r["saved"])
        assert r["pp2_layout"] == {"tp": 1, "pp": 2, "world": 2}


def test_the_weights_load_without_an_optimizer(ranks):
    for r in ranks:
        assert r["weights_only"].keys() == r["saved"]["weights"].keys()
        for key, tensor in r["saved"]["weights"].items():
            assert torch.equal(r["weights_only"][key], tensor), key


def test_an_interrupted_save_leaves_the_previous_checkpoint_the_latest(ranks):
    for r in ranks:
        assert "commit of step 2" in r["interrupted_error"] and "on rank 0" in r["interrupted_error"]
        assert r["latest"] == 1 and r["uncommitted"] == [2]
        assert r["latest_after_resave"] == 2  # a later save of that step commits over the leftovers
