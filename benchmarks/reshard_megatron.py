"""Resharding real megatron-core shards, naive vs allgather-swap, on 4 gloo processes (CPU): ``python -m
benchmarks.reshard --megatron`` runs it.

Per update layout (TP2DP2, PP2DP2, TP2xPP2 on 4 ranks) the ranks are forked once (megatron imported before the
fork); each builds its ``GPTModel`` of a Qwen2-style config (megatron-core's local layer spec, CPU
initialisation), gives every parameter a random gradient and takes one AdamW step, then reshards its own
parameters (``megatron_rules``, global layer names) to the generation layout TP1DP4 (every rank the full,
unpadded model, megatron-named; ``convert.megatron_to_hf`` names it for generation) with each method, and swaps
back. Recorded per rank as in ``benchmarks.reshard.run_once``; Eq. (3) with UTP := tp * pp and the vocabulary
padding counted with TW (``dockflow.reshard.redundancy``).

The Qwen3-MoE cases (``MOE_LAYOUTS``: EP1 and EP2 over the 4 DP ranks, TP1, the experts megatron's per-expert
``SequentialMLP`` tensors, ``engines/megatron/experts.py``'s names and rules) reshard to a full copy per rank (GEP1,
what ``MegatronTrainingEngine`` does) and to TP1EP4DP4 (GEP4), and add per rank the memory model's predictions
(``predict``): the update state and generation weights from the partition, the generation-phase resident bytes
(allgather-swap: the generation weights; naive: those, the grads and AdamW state, and Eq. (3) extended for EP,
``eq3_ep_per_rank``) and the reshard peak's bound (update state + generation weights + one bucket).
"""

from __future__ import annotations

import datetime
import math
import multiprocessing
import os
import queue
import statistics
import tempfile
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.reshard_records import finish_generation
from dockflow.reshard import (
    MEGATRON_VOCAB_MULTIPLE,
    UPDATE_STATE,
    MemoryLedger,
    ModelPartition,
    ParallelLayout,
    ReshardGroups,
    UpdateState,
    allgather_swap,
    eq3_ep_per_rank,
    eq3_inputs,
    global_names,
    measured_redundant_bytes,
    megatron_rules,
    naive_reshard,
    param_meta,
)

WORLD = 4
METHODS = ("naive", "allgather_swap")
LAYOUTS = ((2, 1, 1), (1, 2, 1), (2, 2, 1))  # (tp, pp, ep); dp = WORLD / (tp * pp)
MOE_LAYOUTS = ((1, 1, 1), (1, 1, 2))
GEN_EPS = {False: (1,), True: (1, 4)}  # generation EP sizes per update layout (dense, MoE)
# Qwen2 configs (q/k/v bias); vocabularies that Megatron pads (to 128 x tp), as Qwen's 151936 is at TP2
MODELS: dict[str, dict[str, int]] = {
    "qwen2-mg-6m": {"vocab_size": 4000, "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4},
    "qwen2-mg-21m": {"vocab_size": 8000, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4},
}
QUICK = ["qwen2-mg-6m"]
# Qwen3-MoE (q/k norms, no bias), per-expert tensors: 8 experts, 2 per token
MOE_MODELS: dict[str, dict[str, int]] = {
    "qwen3-moe-mg-9m": {"vocab_size": 4000, "hidden_size": 256, "moe_intermediate_size": 256, "num_experts": 8,
                        "num_hidden_layers": 4},
}
TIMEOUT_S = 1800


def model_spec(model: str) -> Any:
    """The ``DecoderSpec``, the full megatron state's meta (names, shapes, dtypes; experts under their global
    numbers) and the partition rules of ``model``."""
    from dockflow.engines.megatron.convert import hf_to_megatron, spec_from_hf
    from dockflow.engines.megatron.experts import partition_rules, reshard_names

    if model in MOE_MODELS:
        from transformers.models.qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM

        config = Qwen3MoeConfig(num_attention_heads=8, num_key_value_heads=4, head_dim=32, num_experts_per_tok=2,
                                intermediate_size=512, tie_word_embeddings=False, **MOE_MODELS[model])
        spec = spec_from_hf(config)
        with torch.device("meta"):
            meta = param_meta(reshard_names(hf_to_megatron(Qwen3MoeForCausalLM(config).state_dict(), spec)))
        return spec, meta, partition_rules(spec)
    from transformers.models.qwen2 import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=False, **MODELS[model])
    spec = spec_from_hf(config)
    with torch.device("meta"):
        meta = param_meta(hf_to_megatron(Qwen2ForCausalLM(config).state_dict(), spec))
    return spec, meta, megatron_rules(spec.num_layers, spec.num_kv_heads)


def layouts_of(tp: int, pp: int, ep: int = 1, gen_ep: int = 1) -> tuple[ParallelLayout, ParallelLayout]:
    return (ParallelLayout(tp=tp, pp=pp, dp=WORLD // (tp * pp), ep=ep, vocab_multiple=MEGATRON_VOCAB_MULTIPLE),
            ParallelLayout(tp=1, dp=WORLD, ep=gen_ep))


def _shard_bytes(partition: ModelPartition, layout: ParallelLayout, rank: int) -> tuple[int, int]:
    """(bytes, tensors) of ``rank``'s shards in ``layout``."""
    maps = [(n, partition.shard_map(n, layout, rank)) for n in partition.meta]
    held = [(n, m) for n, m in maps if m is not None]
    return sum(math.prod(m.local_shape) * partition.nbytes(n) // math.prod(partition.meta[n].shape)
               for n, m in held), len(held)


def predict(partition: ModelPartition, layouts: tuple[ParallelLayout, ParallelLayout], method: str,
            bucket_bytes: int) -> dict[str, list[float]]:
    """Per rank, the memory model: update weights W (the partition's shards), update state U = W + grads W + AdamW
    2W + a 4-byte step per tensor, generation weights G; generation resident: G (allgather-swap), G + (U - W) +
    Eq. (3) extended for EP (naive); the reshard peak of allgather-swap at most U + G + one bucket."""
    update, gen = layouts
    redundant = eq3_ep_per_rank(partition, update, gen)
    out: dict[str, list[float]] = {k: [] for k in ("weights", "update_state", "gen_weights", "gen_resident",
                                                   "reshard_peak_bound", "redundant")}
    for rank in range(update.size):
        weights, tensors = _shard_bytes(partition, update, rank)
        state = 4 * weights + 4 * tensors
        gen_weights = _shard_bytes(partition, gen, rank)[0]
        resident = gen_weights if method == "allgather_swap" else gen_weights + state - weights + redundant[rank]
        for key, value in (("weights", weights), ("update_state", state), ("gen_weights", gen_weights),
                           ("gen_resident", resident), ("reshard_peak_bound", state + gen_weights + bucket_bytes),
                           ("redundant", redundant[rank] if method == "naive" else 0)):
            out[key].append(value)
    return out


def run_once(method: str, state: UpdateState, partition: ModelPartition, groups: ReshardGroups, *,
             layouts: tuple[ParallelLayout, ParallelLayout], bucket_bytes: int) -> dict[str, Any]:
    update, gen = layouts
    ledger = MemoryLedger("cpu", groups.rank)
    dist.barrier()
    if method == "naive":
        result = naive_reshard(state, partition, update, gen, groups, ledger=ledger)
    else:
        result = allgather_swap(state, partition, update, gen, groups, bucket_bytes=bucket_bytes, ledger=ledger)
    start = ledger.snapshots("reshard")[0].by_category
    record = {
        "gen_peak_bytes": ledger.peak("generation"),
        "reshard_peak_bytes": ledger.peak("reshard"),
        "weights_bytes": start["update_weights"], "update_state_bytes": sum(start[c] for c in UPDATE_STATE),
        "redundant_bytes": measured_redundant_bytes(state.weights.values(), result.generation_weights.values(), "cpu"),
        "temp_peak_bytes": result.temp_peak_bytes, "buckets": result.buckets,
    }
    return {**record, **finish_generation(result, ledger)}


def _update_state(gpt: Any, spec: Any, layout: ParallelLayout, rank: int) -> UpdateState:
    """The rank's parameters under global names (experts by their global number), a random grad each, one AdamW step."""
    from dockflow.engines.megatron.experts import reshard_names

    coords = layout.coords(rank)
    weights = global_names(dict(gpt.named_parameters()), spec.num_layers, layout.pp, coords.pp)
    if spec.is_moe:
        weights = reshard_names(weights, coords.ep * (spec.num_experts // layout.ep))
    seeded = torch.Generator().manual_seed(rank)
    for w in weights.values():
        w.grad = torch.randn(w.shape, generator=seeded)
    optimizer = torch.optim.AdamW(list(weights.values()), lr=1e-3)
    optimizer.step()
    return UpdateState(weights, optimizer)


def worker(rank: int, store: str, layout: tuple[int, int, int], models: list[str], options: dict[str, int],
           results: Any) -> None:
    try:
        from dockflow.engines.megatron import model as mg

        torch.set_num_threads(1)
        tp, pp, ep = layout
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        mg.init_model_parallel(tp=tp, pp=pp, seed=0, device="cpu", ep=ep)
        update = layouts_of(*layout)[0]
        groups = ReshardGroups(update)
        for model in models:
            spec, meta, rules = model_spec(model)
            gpt = mg.build_gpt_model(spec, tp=tp, pp=pp, ep=ep)
            state = _update_state(gpt, spec, update, rank)
            partition = ModelPartition(meta, rules)
            for gen_ep in GEN_EPS[spec.is_moe]:
                for method in METHODS:
                    runs = [run_once(method, state, partition, groups, layouts=layouts_of(*layout, gen_ep),
                                     bucket_bytes=options["bucket_bytes"]) for _ in range(options["repeats"])]
                    results.put(("ok", rank, ((model, gen_ep, method), runs)))
            del gpt, state
        mg.destroy_model_parallel()
        dist.destroy_process_group()
        results.put(("done", rank, None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put(("error", rank, traceback.format_exc()))


def summarize(model: str, layout: tuple[int, int, int], gen_ep: int, method: str,
              per_rank: list[list[dict[str, Any]]], bucket_bytes: int) -> dict[str, Any]:
    """One record: memory maxima over ranks (sums where noted) and per rank, with the memory model's predictions per
    rank (``predict``); timings as medians over repeats of the max over ranks."""
    _, meta, rules = model_spec(model)
    layouts = layouts_of(*layout, gen_ep)
    partition = ModelPartition(meta, rules)
    eq3 = eq3_inputs(partition, *layouts)
    first = [runs[0] for runs in per_rank]

    def timing(key: str) -> float:
        return statistics.median(max(runs[i][key] for runs in per_rank) for i in range(len(per_rank[0])))

    def most(key: str) -> int:
        return max(r[key] for r in first)

    def ranks(key: str) -> list[int]:
        return [r[key] for r in first]

    predicted = predict(partition, layouts, method, bucket_bytes) if layouts[0].pp == 1 else None
    return {
        "method": method, "model": model, "source": "megatron-core GPTModel",
        "params": sum(math.prod(m.shape) for m in meta.values()),
        "update_layout": str(layouts[0]), "gen_layout": str(layouts[1]), "world": WORLD,
        "gen_peak_bytes": most("gen_peak_bytes"), "gen_weights_bytes": most("gen_weights_bytes"),
        "update_state_bytes_in_gen": most("update_state_bytes_in_gen"), "reshard_peak_bytes": most("reshard_peak_bytes"),
        "gen_peak_bytes_per_rank": ranks("gen_peak_bytes"), "reshard_peak_bytes_per_rank": ranks("reshard_peak_bytes"),
        "weights_bytes_per_rank": ranks("weights_bytes"), "update_state_bytes_per_rank": ranks("update_state_bytes"),
        "redundant_bytes": sum(r["redundant_bytes"] for r in first),
        "redundant_bytes_per_rank": ranks("redundant_bytes"),
        "predicted_redundant_bytes": eq3.total, "predicted_redundant_bytes_per_rank": eq3.per_rank,
        "eq3_pad_bytes": eq3.pad_bytes, "predicted": predicted,
        "temp_peak_bytes": most("temp_peak_bytes"),
        "bucket_bytes": bucket_bytes if method == "allgather_swap" else None,
        "buckets": first[0]["buckets"], "host_bytes": most("host_bytes"),
        "reshard_s": timing("reshard_s"), "swap_s": timing("swap_s"), "swap_back_s": timing("swap_back_s"),
        "repeats": len(per_rank[0]),
    }


def run_layout(layout: tuple[int, int, int], models: list[str], bucket_bytes: int,
               repeats: int) -> list[dict[str, Any]]:
    """Fork the 4 ranks for one update layout and collect every (model, generation EP, method)."""
    import megatron.core  # noqa: F401 - once, before the forks: the ranks inherit the import
    import torch._dynamo  # noqa: F401 - AdamW imports it on first use

    results_q = multiprocessing.get_context("fork").Queue()
    collected: dict[tuple[str, int, str], dict[int, list[dict[str, Any]]]] = {}
    options = {"bucket_bytes": bucket_bytes, "repeats": repeats}
    with tempfile.TemporaryDirectory() as tmp:
        procs = mp.start_processes(worker, args=(os.path.join(tmp, "store"), layout, models, options, results_q),
                                   nprocs=WORLD, join=False, start_method="fork")
        done: set[int] = set()
        try:
            while len(done) < WORLD:
                try:
                    status, rank, payload = results_q.get(timeout=TIMEOUT_S)
                except queue.Empty:
                    raise TimeoutError(f"megatron ranks {sorted(set(range(WORLD)) - done)} of layout "
                                       f"TP{layout[0]}xPP{layout[1]}xEP{layout[2]} sent nothing for {TIMEOUT_S} s") from None
                if status == "error":
                    raise RuntimeError(f"rank {rank} failed:\n{payload}")
                if status == "done":
                    done.add(rank)
                    continue
                key, runs = payload
                collected.setdefault(key, {})[rank] = runs
            exit_by = time.monotonic() + 60
            while not procs.join(timeout=max(exit_by - time.monotonic(), 0.1)):
                if time.monotonic() > exit_by:
                    raise TimeoutError("benchmark ranks finished but did not all exit within 60 s")
        finally:
            for p in procs.processes:
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=10)
    return [summarize(model, layout, gen_ep, method, [runs[r] for r in range(WORLD)], bucket_bytes)
            for (model, gen_ep, method), runs in collected.items()]


def run(quick: bool, bucket_bytes: int, repeats: int, moe_only: bool = False) -> list[dict[str, Any]]:
    """The dense models over ``LAYOUTS`` (unless ``moe_only``), then the MoE ones over ``MOE_LAYOUTS``."""
    dense = [] if moe_only else [(layout, QUICK if quick else list(MODELS)) for layout in LAYOUTS]
    cases = [*dense, *((layout, list(MOE_MODELS)) for layout in MOE_LAYOUTS)]
    return [record for layout, models in cases for record in run_layout(layout, models, bucket_bytes, repeats)]


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def print_ep_table(results: list[dict[str, Any]]) -> None:
    """The ledger against the memory model, per rank (max over ranks; redundant summed), for the MoE records."""
    print("MiB per rank (max over the 4 ranks; measured / predicted); redundant: sum over the ranks")
    header = (f"{'update':<12}{'gen':<12}{'method':<16}{'weights':>9}{'upd state':>11}{'gen weights':>12}"
              f"{'gen resident':>16}{'swap peak / bound':>20}{'redundant':>19}{'Eq.(3) printed':>15}")
    print(header)
    print("-" * len(header))
    for r in results:
        p = r["predicted"]
        if r["model"] not in MOE_MODELS or p is None:
            continue
        bound = _mib(max(p["reshard_peak_bound"])) if r["method"] == "allgather_swap" else "-"  # naive: no bucket
        print(f"{r['update_layout']:<12}{r['gen_layout']:<12}{r['method']:<16}"
              f"{_mib(max(r['weights_bytes_per_rank'])):>9}{_mib(max(r['update_state_bytes_per_rank'])):>11}"
              f"{_mib(r['gen_weights_bytes']):>12}"
              f"{_mib(r['gen_peak_bytes']) + ' / ' + _mib(max(p['gen_resident'])):>16}"
              f"{_mib(r['reshard_peak_bytes']) + ' / ' + bound:>20}"
              f"{_mib(r['redundant_bytes']) + ' / ' + _mib(sum(p['redundant'])):>19}"
              f"{_mib(r['predicted_redundant_bytes']):>15}")
