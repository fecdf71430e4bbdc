"""Resharding real megatron-core shards, naive vs allgather-swap, on 4 gloo processes (CPU): ``python -m
benchmarks.reshard --megatron`` runs it.

Per update layout (TP2DP2, PP2DP2, TP2xPP2 on 4 ranks) the ranks are forked once (megatron imported before the
fork); each builds its ``GPTModel`` of a Qwen2-style config (megatron-core's local layer spec, CPU
initialisation), gives every parameter a random gradient and takes one AdamW step, then reshards its own
parameters (``megatron_rules``, global layer names) to the generation layout TP1DP4 (every rank the full,
unpadded model, megatron-named; ``convert.megatron_to_hf`` names it for generation) with each method, and swaps
back. Recorded per rank as in ``benchmarks.reshard.run_once``; Eq. (3) with UTP := tp * pp and the vocabulary
padding counted with TW (``dockflow.reshard.redundancy``).
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
    MemoryLedger,
    ModelPartition,
    ParallelLayout,
    ReshardGroups,
    UpdateState,
    allgather_swap,
    eq3_inputs,
    global_names,
    measured_redundant_bytes,
    megatron_rules,
    naive_reshard,
    param_meta,
)

WORLD = 4
METHODS = ("naive", "allgather_swap")
LAYOUTS = ((2, 1), (1, 2), (2, 2))  # (tp, pp); dp = WORLD / (tp * pp)
# Qwen2 configs (q/k/v bias); vocabularies that Megatron pads (to 128 x tp), as Qwen's 151936 is at TP2
MODELS: dict[str, dict[str, int]] = {
    "qwen2-mg-6m": {"vocab_size": 4000, "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4},
    "qwen2-mg-21m": {"vocab_size": 8000, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4},
}
QUICK = ["qwen2-mg-6m"]
TIMEOUT_S = 1800


def model_spec(model: str) -> Any:
    """The ``DecoderSpec`` and the full megatron state's meta (names, shapes, dtypes) of ``model``."""
    from transformers.models.qwen2 import Qwen2Config, Qwen2ForCausalLM

    from dockflow.engines.megatron.convert import hf_to_megatron, spec_from_hf

    config = Qwen2Config(num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=False, **MODELS[model])
    spec = spec_from_hf(config)
    with torch.device("meta"):
        meta = param_meta(hf_to_megatron(Qwen2ForCausalLM(config).state_dict(), spec))
    return spec, meta


def layouts_of(tp: int, pp: int) -> tuple[ParallelLayout, ParallelLayout]:
    return (ParallelLayout(tp=tp, pp=pp, dp=WORLD // (tp * pp), vocab_multiple=MEGATRON_VOCAB_MULTIPLE),
            ParallelLayout(tp=1, dp=WORLD))


def run_once(method: str, state: UpdateState, partition: ModelPartition, groups: ReshardGroups, *,
             layouts: tuple[ParallelLayout, ParallelLayout], bucket_bytes: int) -> dict[str, Any]:
    update, gen = layouts
    ledger = MemoryLedger("cpu", groups.rank)
    dist.barrier()
    if method == "naive":
        result = naive_reshard(state, partition, update, gen, groups, ledger=ledger)
    else:
        result = allgather_swap(state, partition, update, gen, groups, bucket_bytes=bucket_bytes, ledger=ledger)
    record = {
        "gen_peak_bytes": ledger.peak("generation"),
        "reshard_peak_bytes": ledger.peak("reshard"),
        "redundant_bytes": measured_redundant_bytes(state.weights.values(), result.generation_weights.values(), "cpu"),
        "temp_peak_bytes": result.temp_peak_bytes, "buckets": result.buckets,
    }
    return {**record, **finish_generation(result, ledger)}


def worker(rank: int, store: str, layout: tuple[int, int], models: list[str], options: dict[str, int],
           results: Any) -> None:
    try:
        from dockflow.engines.megatron import model as mg

        torch.set_num_threads(1)
        tp, pp = layout
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        mg.init_model_parallel(tp=tp, pp=pp, seed=0, device="cpu")
        layouts = layouts_of(tp, pp)
        groups = ReshardGroups(layouts[0])
        for model in models:
            spec, meta = model_spec(model)
            gpt = mg.build_gpt_model(spec, tp=tp, pp=pp)
            weights = global_names(dict(gpt.named_parameters()), spec.num_layers, pp, layouts[0].coords(rank).pp)
            seeded = torch.Generator().manual_seed(rank)
            for w in weights.values():
                w.grad = torch.randn(w.shape, generator=seeded)
            optimizer = torch.optim.AdamW(list(weights.values()), lr=1e-3)
            optimizer.step()
            state = UpdateState(weights, optimizer)
            partition = ModelPartition(meta, megatron_rules(spec.num_layers, spec.num_kv_heads))
            for method in METHODS:
                runs = [run_once(method, state, partition, groups, layouts=layouts,
                                 bucket_bytes=options["bucket_bytes"]) for _ in range(options["repeats"])]
                results.put(("ok", rank, (model, layout, method, runs)))
            del gpt, weights, state, optimizer
        mg.destroy_model_parallel()
        dist.destroy_process_group()
        results.put(("done", rank, None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put(("error", rank, traceback.format_exc()))


def summarize(model: str, layout: tuple[int, int], method: str, per_rank: list[list[dict[str, Any]]],
              bucket_bytes: int) -> dict[str, Any]:
    """One record: memory maxima over ranks (sums where noted), timings as medians over repeats of the max over ranks."""
    spec, meta = model_spec(model)
    update, gen = layouts_of(*layout)
    eq3 = eq3_inputs(ModelPartition(meta, megatron_rules(spec.num_layers, spec.num_kv_heads)), update, gen)
    first = [runs[0] for runs in per_rank]

    def timing(key: str) -> float:
        return statistics.median(max(runs[i][key] for runs in per_rank) for i in range(len(per_rank[0])))

    def most(key: str) -> int:
        return max(r[key] for r in first)

    return {
        "method": method, "model": model, "source": "megatron-core GPTModel",
        "params": sum(math.prod(m.shape) for m in meta.values()),
        "update_layout": str(update), "gen_layout": str(gen), "world": WORLD,
        "gen_peak_bytes": most("gen_peak_bytes"), "gen_weights_bytes": most("gen_weights_bytes"),
        "update_state_bytes_in_gen": most("update_state_bytes_in_gen"), "reshard_peak_bytes": most("reshard_peak_bytes"),
        "gen_peak_bytes_per_rank": [r["gen_peak_bytes"] for r in first],
        "redundant_bytes": sum(r["redundant_bytes"] for r in first),
        "redundant_bytes_per_rank": [r["redundant_bytes"] for r in first],
        "predicted_redundant_bytes": eq3.total, "predicted_redundant_bytes_per_rank": eq3.per_rank,
        "eq3_pad_bytes": eq3.pad_bytes,
        "temp_peak_bytes": most("temp_peak_bytes"),
        "bucket_bytes": bucket_bytes if method == "allgather_swap" else None,
        "buckets": first[0]["buckets"], "host_bytes": most("host_bytes"),
        "reshard_s": timing("reshard_s"), "swap_s": timing("swap_s"), "swap_back_s": timing("swap_back_s"),
        "repeats": len(per_rank[0]),
    }


def run_layout(layout: tuple[int, int], models: list[str], bucket_bytes: int, repeats: int) -> list[dict[str, Any]]:
    """Fork the 4 ranks for one update layout and collect every (model, method)."""
    import megatron.core  # noqa: F401 - once, before the forks: the ranks inherit the import
    import torch._dynamo  # noqa: F401 - AdamW imports it on first use

    results_q = multiprocessing.get_context("fork").Queue()
    collected: dict[tuple[str, str], dict[int, list[dict[str, Any]]]] = {}
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
                    raise TimeoutError(f"megatron ranks {sorted(set(range(WORLD)) - done)} of layout TP{layout[0]}"
                                       f"xPP{layout[1]} sent nothing for {TIMEOUT_S} s") from None
                if status == "error":
                    raise RuntimeError(f"rank {rank} failed:\n{payload}")
                if status == "done":
                    done.add(rank)
                    continue
                model, _, method, runs = payload
                collected.setdefault((model, method), {})[rank] = runs
            exit_by = time.monotonic() + 60
            while not procs.join(timeout=max(exit_by - time.monotonic(), 0.1)):
                if time.monotonic() > exit_by:
                    raise TimeoutError("benchmark ranks finished but did not all exit within 60 s")
        finally:
            for p in procs.processes:
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=10)
    return [summarize(model, layout, method, [collected[(model, method)][r] for r in range(WORLD)], bucket_bytes)
            for model in models for method in METHODS]


def run(quick: bool, bucket_bytes: int, repeats: int) -> list[dict[str, Any]]:
    models = QUICK if quick else list(MODELS)
    return [record for layout in LAYOUTS for record in run_layout(layout, models, bucket_bytes, repeats)]
