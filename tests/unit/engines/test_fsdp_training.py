"""FSDPTrainingEngine on 2 gloo ranks against TorchTrainingEngine on one process, same data.

One start of the ranks for the module: each rank builds the same tiny Qwen2, trains one mini-batch on its half (unequal token
counts, so the global loss normalisation matters), reshards for generation, saves and reloads its state.
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from fixtures.ranks import start_ranks
from fixtures.tiny_models import tiny_moe, tiny_qwen2
from tensordict import TensorDict

from dockflow.engines import TorchTrainingEngine
from dockflow.reshard import UPDATE_STATE

WORLD = 2
LR, CLIP = 1e-2, 0.5


def tiny_model():
    return tiny_qwen2(vocab_size=40)


def mini_batch() -> TensorDict:
    """8 rows, prompt 4 + response 4 tokens; response lengths 1..4, so the two halves differ in tokens."""
    gen = torch.Generator().manual_seed(1)
    responses = torch.randint(1, 40, (8, 4), generator=gen)
    lengths = torch.tensor([4, 4, 3, 4, 1, 2, 1, 2])
    response_mask = (torch.arange(4) < lengths[:, None]).long()
    prompts = torch.randint(1, 40, (8, 4), generator=gen)
    return TensorDict({
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": torch.cat([torch.ones_like(prompts), response_mask], 1),
        "responses": responses,
        "response_mask": response_mask,
    }, batch_size=[8])


def loss_fn(logp: torch.Tensor, micro: TensorDict, tokens: float):
    mask = micro["response_mask"]
    loss = -(logp * mask).sum() / tokens
    return loss, {"mean_logp": float((logp.detach() * mask).sum() / mask.sum().clamp(min=1))}


def routed_batch() -> TensorDict:
    """:func:`mini_batch` with recorded experts for ``tiny_moe`` (2 layers, 4 experts, top-2): random pairs, -1 on
    padding and on each row's last token."""
    batch = mini_batch()
    gen = torch.Generator().manual_seed(2)
    routed = torch.rand(8, 8, 2, 4, generator=gen).argsort(-1)[..., :2].to(torch.int16)
    last = batch["attention_mask"].sum(-1) - 1
    routed[torch.arange(8), last] = -1
    batch["routed_experts"] = routed.masked_fill(~batch["attention_mask"].bool()[..., None, None], -1)
    return batch


@contextmanager
def one_thread():
    """torch at one thread: on a busy 2-core machine two OpenMP threads make this tiny model's step take seconds
    (measured 5.2 s against 0.08 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def replay_reference() -> tuple[torch.Tensor, dict[str, float]]:
    """DP=1 with routing replay: the log-probs and one step's metrics on :func:`routed_batch`."""
    with one_thread():
        engine = TorchTrainingEngine(tiny_moe(), lr=LR, grad_clip=CLIP, router_replay=True)
        logp = engine.infer(routed_batch())
        return logp, engine.train_mini_batch(routed_batch(), loss_fn, micro_batch_size=2)


def reference() -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    engine = TorchTrainingEngine(tiny_model(), lr=LR, grad_clip=CLIP)
    metrics = engine.train_mini_batch(mini_batch(), loss_fn, micro_batch_size=2)
    return metrics, {k: v.clone() for k, v in engine.model.state_dict().items()}


def _rank(rank: int, store_path: str, out_dir: str) -> None:
    from dockflow.engines.fsdp_training import FSDPTrainingEngine

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    out = Path(out_dir)
    engine = FSDPTrainingEngine(tiny_model(), lr=LR, grad_clip=CLIP, bucket_bytes=4096)
    initial = {n: p.clone() for n, p in engine.generation_weights()}  # resharded at construction
    share = mini_batch()[rank * 4:(rank + 1) * 4]
    logp = engine.infer(share)
    metrics = engine.train_mini_batch(share, loss_fn, micro_batch_size=2)
    generation = {n: p.clone() for n, p in engine.generation_weights()}  # the reshard after the update
    memory = engine.memory_metrics()
    state = engine.state_dict()  # in the generation state: swaps back, and out again
    kept = {n: p.clone() for n, p in engine.policy_module().named_parameters()}  # the full generation copy
    if rank == 0:
        torch.save(state, out / "state.pt")
    dist.barrier()
    engine.load_state_dict(torch.load(out / "state.pt", weights_only=False))  # every rank reads the full state
    reloaded = {n: p.clone() for n, p in engine.generation_weights()}  # clones: the next update frees them
    again = engine.train_mini_batch(share, loss_fn, micro_batch_size=2)  # swaps back; the reloaded optimizer steps
    # Token budgets: rank 0's rows (8, 8, 7, 8 tokens) are 4 micro-batches of one row at 13 tokens, rank 1's (5, 6,
    # 5, 6) 2 of two rows; rank 1 adds 2 empty ones so that FSDP's collectives pair up.
    budget = FSDPTrainingEngine(tiny_model(), lr=LR, grad_clip=CLIP, bucket_bytes=4096, max_tokens_per_micro_batch=13)
    budget_bounds = budget._micro_batches(share, micro_batch_size=2)
    budget_metrics = budget.train_mini_batch(share, loss_fn, micro_batch_size=2)
    budget_weights = {n: p.clone() for n, p in budget.generation_weights()}
    moe = FSDPTrainingEngine(tiny_moe(), lr=LR, grad_clip=CLIP, bucket_bytes=2**16, router_replay=True)
    routed = routed_batch()[rank * 4:(rank + 1) * 4]
    replayed = {"logp": moe.infer(routed), "metrics": moe.train_mini_batch(routed, loss_fn, micro_batch_size=2)}
    result = {"replayed": replayed, "state": state, "initial": initial, "generation": generation, "metrics": metrics, "memory": memory,
              "kept": kept, "reloaded": reloaded, "logp": logp, "again": again, "budget_bounds": budget_bounds,
              "budget_metrics": budget_metrics, "budget_weights": budget_weights}
    torch.save(result, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("fsdp")
    start_ranks(_rank, (str(tmp / "store"), str(tmp)), WORLD)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def test_one_dp2_step_equals_the_dp1_step_on_the_union(ranks):
    metrics, after = reference()
    for r in ranks:
        assert r["metrics"].keys() == metrics.keys()
        for k, v in metrics.items():
            if k not in ("train/dp_load_imbalance", "train/padding_fraction"):  # the layout's, below
                assert r["metrics"][k] == pytest.approx(v, rel=1e-5), k
        # Padded, rank 0's rows (lengths 4,4,3,4) compute 32 positions in 2 micro-batches, rank 1's (1,2,1,2) 24:
        # 3 of 56 are padding. A micro-batch goes packed (no padding) where both ranks' packing pays.
        assert 0.0 <= r["metrics"]["train/padding_fraction"] <= 3 / 56 + 1e-12
        assert r["metrics"]["train/padding_fraction"] == ranks[0]["metrics"]["train/padding_fraction"]
        for name, weight in r["generation"].items():
            # AdamW's first step is ~lr * sign(grad): summation-order noise in tiny grads moves a weight by up
            # to ~1e-5 (of a 1e-2 step); the grads themselves agree (the grad norm above, to 1e-5)
            torch.testing.assert_close(weight, after[name], rtol=0, atol=LR * 1e-2, msg=name)
    model = tiny_model()
    with torch.no_grad():
        logp = TorchTrainingEngine(model, lr=LR).infer(mini_batch())
    mask = mini_batch()["response_mask"]  # past a row's end the value depends on the batch's padding
    torch.testing.assert_close(torch.cat([r["logp"] for r in ranks]) * mask, logp * mask, rtol=1e-5, atol=1e-6)
    for name, weight in model.named_parameters():
        torch.testing.assert_close(ranks[0]["initial"][name], weight.detach(), msg=name)


def test_token_budgets_give_the_same_step_with_unequal_micro_batch_counts(ranks):
    metrics, after = reference()
    assert ranks[0]["budget_bounds"] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert ranks[1]["budget_bounds"] == [(0, 2), (2, 4), (4, 4), (4, 4)]  # two empty: the collectives pair up
    for r in ranks:
        assert r["budget_metrics"]["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5)
        for name, weight in r["budget_weights"].items():  # as above: AdamW's first step on tiny grads
            torch.testing.assert_close(weight, after[name], rtol=0, atol=LR * 1e-2, msg=name)


def test_fsdp2_replays_the_recorded_routing_as_dp1_does(ranks):
    """An MoE policy under routing replay: log-probs and the step's grad norm on 2 ranks equal DP=1's."""
    logp, metrics = replay_reference()
    mask = routed_batch()["response_mask"]
    torch.testing.assert_close(torch.cat([r["replayed"]["logp"] for r in ranks]) * mask, logp * mask, rtol=1e-5,
                               atol=1e-6)
    with one_thread():
        free = TorchTrainingEngine(tiny_moe(), lr=LR).infer(mini_batch())
    assert float(((free - logp) * mask).abs().max()) > 1e-3  # the random routing is not the model's own
    for r in ranks:
        assert r["replayed"]["metrics"]["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5)


def test_dp1_reports_no_imbalance():
    metrics, _ = reference()
    assert metrics["train/dp_load_imbalance"] == 1.0


def test_the_full_state_dict_has_dp1_keys_and_round_trips(ranks):
    _, after = reference()
    full, empty = ranks[0]["state"], ranks[1]["state"]
    assert full["model"].keys() == after.keys()  # tied lm_head included, as model.state_dict() has it
    for name, value in after.items():
        torch.testing.assert_close(full["model"][name], value, rtol=0, atol=LR * 1e-2, msg=name)
    assert full["optimizer"]["state"] and not empty["model"]
    for r in ranks:
        for name, weight in r["generation"].items():
            assert torch.equal(r["kept"][name], weight), f"state_dict changed the generation weights: {name}"
            assert torch.equal(r["reloaded"][name], weight), f"load_state_dict did not restore {name}"
        assert r["again"]["grad_norm"] == pytest.approx(ranks[0]["again"]["grad_norm"])


def test_no_update_state_on_the_device_during_generation(ranks):
    for rank, r in enumerate(ranks):
        memory = r["memory"]
        prefix = f"memory/rank{rank}"
        for category in UPDATE_STATE:
            assert memory[f"{prefix}/generation/{category}_bytes"] == 0, category
        assert memory[f"{prefix}/update/optimizer_state_bytes"] > 0
        assert memory[f"{prefix}/update/grads_bytes"] > 0
        assert memory[f"{prefix}/reshard/update_weights_bytes"] > 0  # before the swap
        assert memory[f"{prefix}/update/generation_weights_bytes"] == 0
        params = sum(w.numel() * w.element_size() for w in r["generation"].values())
        assert memory[f"{prefix}/generation/generation_weights_bytes"] == params
        assert 0 < memory[f"{prefix}/reshard/temp_buffer_bytes"] <= 4096 * 2 + 64
