"""Resharding over 4 gloo processes, naive and allgather-swap, on tiny transformers models (no downloads).

Cases: TP2DP2 -> TP1DP4 (a Qwen2 whose layer 0 stores fused qkv / gate_up projections), TP2EP2DP2 ->
TP1EP4DP4 (Qwen3-MoE, the paper's Fig. 3 case) and FSDP-sharded DP4 -> replicated (Qwen2 with sizes that
need FSDP padding). The 4 processes are started once for the module; each runs every case with both
methods and sends its measurements back through a queue; the tests assert on them: generation shards equal
the reference slices, the update state comes back bit-identical after swap_back, allgather-swap leaves no
update state on the "device" and keeps at most one bucket alive, naive's redundancy matches Eq. (3).

The workers start from the suite's fork server (``tests/fixtures/ranks.py``), with torch and the optimizer's
torch._dynamo import already loaded. They set one torch thread before any op and use nothing but torch and gloo.
"""

from __future__ import annotations

import datetime
import queue
import time
import traceback
from typing import Any

import pytest
import torch
import torch.distributed as dist
from fixtures.ranks import CONTEXT, start_ranks

from dockflow.reshard import (
    UPDATE_STATE,
    MemoryLedger,
    ModelPartition,
    ParallelLayout,
    PartitionRules,
    ReshardGroups,
    UpdateState,
    allgather_swap,
    eq3_inputs,
    measured_redundant_bytes,
    naive_reshard,
    param_meta,
)

WORLD = 4
BUCKET_BYTES = 20_000  # small enough that the tiny models need several buckets and split the embeddings
RESULT_TIMEOUT_S = 120  # the whole run takes a few seconds; this bounds a hang
METHODS = ("naive", "allgather_swap")


# -- the cases (built in the parent: only it imports transformers) ----------------------------------------
def _qwen2_meta(vocab: int, intermediate: int, fused_layer0: bool) -> dict[str, Any]:
    from transformers.models.qwen2 import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=intermediate, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    with torch.device("meta"):
        meta = param_meta(Qwen2ForCausalLM(config))
    if not fused_layer0:
        return meta
    # Layer 0 stored fused, as vLLM-style models do: [q; k; v] rows and [gate; up] rows.
    prefix = "model.layers.0."
    fused: dict[str, Any] = {}
    for name, m in meta.items():
        if name.startswith(prefix + "self_attn.q_proj."):
            suffix = name.rsplit(".", 1)[1]
            rows = sum(meta[f"{prefix}self_attn.{p}_proj.{suffix}"].shape[0] for p in "qkv")
            fused[f"{prefix}self_attn.qkv_proj.{suffix}"] = type(m)((rows, *m.shape[1:]), m.dtype)
        elif name == prefix + "mlp.gate_proj.weight":
            fused[prefix + "mlp.gate_up_proj.weight"] = type(m)((2 * m.shape[0], *m.shape[1:]), m.dtype)
        elif not any(name.startswith(prefix + p) for p in ("self_attn.k_proj", "self_attn.v_proj", "mlp.up_proj")):
            fused[name] = m
    return fused


def _qwen3_moe_meta() -> dict[str, Any]:
    from transformers.models.qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            num_experts=4, num_experts_per_tok=2)
    with torch.device("meta"):
        return param_meta(Qwen3MoeForCausalLM(config))


def _cases() -> dict[str, dict[str, Any]]:
    return {
        "tp2dp2_to_tp1dp4": {"meta": _qwen2_meta(64, 64, fused_layer0=True), "qkv_sections": (32, 16, 16),
                             "update": ParallelLayout(tp=2, dp=2), "gen": ParallelLayout(tp=1, dp=4)},
        "tp2ep2dp2_to_tp1ep4dp4": {"meta": _qwen3_moe_meta(), "qkv_sections": None,
                                   "update": ParallelLayout(tp=2, dp=2, ep=2), "gen": ParallelLayout(tp=1, dp=4, ep=4)},
        # vocab 50 and intermediate 42 do not divide by 4: FSDP pads the last chunks
        "fsdp_dp4_to_replicated": {"meta": _qwen2_meta(50, 42, fused_layer0=False), "qkv_sections": None,
                                   "update": ParallelLayout(tp=1, dp=4, fsdp=True), "gen": ParallelLayout(tp=1, dp=4)},
    }


# -- what each rank runs -----------------------------------------------------------------------------------
def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().reshape(-1).clone().view(torch.uint8).numpy().tobytes()  # clone: numpy() pins storages


def _state_bytes(state: UpdateState) -> dict[str, bytes]:
    out = {f"w/{n}": _bytes(t) for n, t in state.weights.items()}
    out |= {f"g/{n}": _bytes(t.grad) for n, t in state.weights.items() if t.grad is not None}
    assert state.optimizer is not None
    for i, (p, s) in enumerate(state.optimizer.state.items()):
        out |= {f"o/{i}/{k}/{tuple(p.shape)}": _bytes(v) for k, v in s.items() if isinstance(v, torch.Tensor)}
    return out


def _numpy(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {n: t.detach().clone().numpy() for n, t in tensors.items()}


def _update_state(partition: ModelPartition, layout: ParallelLayout, rank: int) -> UpdateState:
    """This rank's update shards after one real AdamW step; grads are shards of one full gradient, as after
    a DP all-reduce, so DP replicas stay identical."""
    seeded = torch.Generator().manual_seed(7)
    full = {n: torch.randn(m.shape, generator=seeded) for n, m in partition.meta.items()}
    grads = {n: torch.randn(m.shape, generator=seeded) for n, m in partition.meta.items()}
    weights = {n: torch.nn.Parameter(t) for n, t in partition.shards(full, layout, rank).items()}
    for n, w in weights.items():
        w.grad = partition.shard(n, grads[n], layout, rank)
    optimizer = torch.optim.AdamW(list(weights.values()), lr=1e-2)
    optimizer.step()
    return UpdateState(weights, optimizer)


def _run_case(case: dict[str, Any], method: str, rank: int, groups: ReshardGroups) -> dict[str, Any]:
    partition = ModelPartition(case["meta"], PartitionRules(qkv_sections=case["qkv_sections"]))
    update, gen = case["update"], case["gen"]
    state = _update_state(partition, update, rank)
    before = _state_bytes(state)
    update_shards = _numpy(dict(state.weights))
    ledger = MemoryLedger("cpu", rank)
    if method == "naive":
        result = naive_reshard(state, partition, update, gen, groups, ledger=ledger)
    else:
        result = allgather_swap(state, partition, update, gen, groups, bucket_bytes=BUCKET_BYTES, ledger=ledger)
    ready = ledger.snapshots("generation")[-1]
    got = result.generation_weights
    out = {
        "update_shards": update_shards,
        "generation": _numpy(got),
        "update_state_bytes_in_generation": sum(ready.by_category[c] for c in UPDATE_STATE),
        "temp_peak_bytes": result.temp_peak_bytes,
        "ledger_temp_peak_bytes": ledger.category_peak("reshard", "temp_buffer"),
        "buckets": result.buckets,
        "redundant_bytes": measured_redundant_bytes(state.weights.values(), got.values(), "cpu"),
        "eq3": eq3_inputs(partition, update, gen),
        "metrics": ledger.to_metrics(),
    }
    if result.swap is not None:
        generation_before = {n: _bytes(t) for n, t in got.items()}
        future = result.swap.start_swap_back()  # overlaps "generation": read the generation weights meanwhile
        out["changed_during_swap_back"] = sorted(n for n, t in got.items() if _bytes(t) != generation_before[n])
        result.swap.swap_back(timeout=60)
        out["swap_back_done"] = future.done()
    after = _state_bytes(state)
    out["changed_after_swap_back"] = sorted(k for k in before if after.get(k) != before[k])
    state.optimizer.step()  # the restored state is usable by the next update
    return out


def _worker(rank: int, store_path: str, cases: dict[str, dict[str, Any]], results: Any) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=RESULT_TIMEOUT_S))
        out = {}
        for name, case in cases.items():
            groups = ReshardGroups(case["update"])
            for method in METHODS:
                out[(name, method)] = _run_case(case, method, rank, groups)
        results.put(("ok", rank, out))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the tests with it
        results.put(("error", rank, traceback.format_exc()))


@pytest.fixture(scope="module")
def cases() -> dict[str, dict[str, Any]]:
    return _cases()


@pytest.fixture(scope="module")
def results(cases: dict[str, dict[str, Any]],
            tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Per (case, method): the 4 ranks' measurements, from one start of the 4 processes."""
    import torch._dynamo  # noqa: F401 - AdamW imports it on first use; once here rather than in every child

    queue_ = CONTEXT.Queue()
    store = tmp_path_factory.mktemp("reshard") / "store"
    procs = start_ranks(_worker, (str(store), cases, queue_), WORLD, join=False)
    by_rank: dict[int, dict] = {}
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    try:
        while len(by_rank) < WORLD:
            left = deadline - time.monotonic()
            try:
                status, rank, payload = queue_.get(timeout=max(left, 0.1))
            except queue.Empty:
                raise TimeoutError(f"reshard workers: results of ranks {sorted(set(range(WORLD)) - set(by_rank))} "
                                   f"did not arrive within {RESULT_TIMEOUT_S} s") from None
            if status == "error":
                raise RuntimeError(f"reshard worker rank {rank} failed:\n{payload}")
            by_rank[rank] = payload
        exit_by = time.monotonic() + 30
        while not procs.join(timeout=max(exit_by - time.monotonic(), 0.1)):  # returns as each process exits
            if time.monotonic() > exit_by:
                raise TimeoutError("reshard workers sent their results but did not all exit within 30 s")
    finally:
        for p in procs.processes:
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
    return {key: [by_rank[r][key] for r in range(WORLD)] for key in by_rank[0]}


CASES = ("tp2dp2_to_tp1dp4", "tp2ep2dp2_to_tp1ep4dp4", "fsdp_dp4_to_replicated")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", CASES)
def test_generation_shards_equal_reference_slices(results, cases, case, method):
    """The reference is the full model the update shards represent (after the AdamW step)."""
    spec = cases[case]
    partition = ModelPartition(spec["meta"], PartitionRules(qkv_sections=spec["qkv_sections"]))
    ranks = results[(case, method)]
    for name in partition.meta:
        held = {r: torch.from_numpy(x["update_shards"][name]) for r, x in enumerate(ranks) if name in x["update_shards"]}
        reference = partition.assemble(name, held, spec["update"])
        for rank, shard in held.items():  # replicas agree, so the reference is well defined
            assert torch.equal(shard, partition.shard(name, reference, spec["update"], rank)), (name, rank)
        for rank, r in enumerate(ranks):
            expected = partition.shard(name, reference, spec["gen"], rank)
            got = r["generation"].get(name)
            assert (got is None) == (expected is None), (name, rank)
            if expected is not None:
                assert torch.from_numpy(got).view(torch.uint8).equal(expected.view(torch.uint8)), (name, rank)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", CASES)
def test_update_state_bit_identical_after_swap_back(results, case, method):
    for rank, r in enumerate(results[(case, method)]):
        assert r["changed_after_swap_back"] == [], f"rank {rank}"


@pytest.mark.parametrize("case", CASES)
def test_allgather_swap_leaves_no_update_state_and_one_bucket(results, case):
    for rank, r in enumerate(results[(case, "allgather_swap")]):
        assert r["update_state_bytes_in_generation"] == 0, f"rank {rank}"
        assert r["redundant_bytes"] == 0, f"rank {rank}"
        assert 0 < r["temp_peak_bytes"] <= BUCKET_BYTES, f"rank {rank}"
        assert r["ledger_temp_peak_bytes"] == r["temp_peak_bytes"], f"rank {rank}"
        assert r["buckets"] > 1, f"rank {rank}: the case should need several buckets"
        assert r["changed_during_swap_back"] == [] and r["swap_back_done"], f"rank {rank}"
        assert r["metrics"]["memory/generation/update_weights_bytes"] == 0.0


@pytest.mark.parametrize("case", CASES)
def test_naive_redundancy_matches_eq3(results, case):
    ranks = results[(case, "naive")]
    eq3 = ranks[0]["eq3"]
    for rank, r in enumerate(ranks):
        assert r["update_state_bytes_in_generation"] > 0, f"rank {rank}: naive keeps the update state resident"
        assert r["redundant_bytes"] == pytest.approx(eq3.per_rank, rel=0.05), f"rank {rank}"
    assert sum(r["redundant_bytes"] for r in ranks) == pytest.approx(eq3.total, rel=0.05)
