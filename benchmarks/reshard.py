"""Resharding flow, naive (paper Fig. 3) vs allgather-swap (Fig. 5), side by side on 4 gloo processes (CPU).

Each process is one rank of the update layout (TP2DP2 for the Qwen2 models, TP2EP2DP2 for the Qwen3-MoE one)
holding its shards, their grads and a real AdamW state after one step; it reshards to the generation layout
(TP1DP4 / TP1EP4DP4) with each method, then swaps back. A per-rank ``MemoryLedger`` counts the tracked
tensors (the CPU stands in for the device). Reported per method and model, maxima over ranks unless noted:
``gen_peak_bytes`` (device bytes per rank during generation: generation weights plus whatever of the update
state stayed), ``redundant_bytes`` (weight bytes resident during generation that generation does not use,
summed over ranks) next to Eq. (3)'s ``predicted_redundant_bytes`` (the same sum), ``temp_peak_bytes`` (the
largest temporary allgather buffer) and ``bucket_bytes``, ``reshard_s`` (allgather + copy) and ``swap_s``
(device -> host) and ``swap_back_s`` (medians over ``--repeats``). Models are built from transformers
configs on the meta device; weights are random; nothing is downloaded.

``--megatron``: the same on real megatron-core shards (TP2DP2, PP2DP2, TP2xPP2 -> TP1DP4; a Qwen3-MoE at EP1 and
EP2 -> TP1DP4 and TP1EP4DP4, with the ledger against the memory model per rank; ``--moe-only``: just those;
``benchmarks.reshard_megatron``).

Usage: ``python -m benchmarks.reshard --out reshard.json [--quick] [--megatron [--moe-only]] [--bucket-mb 16]
[--repeats 3]``.
"""

from __future__ import annotations

import argparse
import datetime
import math
import multiprocessing
import os
import queue
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.reshard_records import finish_generation
from benchmarks.results_file import write_results
from dockflow.reshard import (
    MemoryLedger,
    ModelPartition,
    ParallelLayout,
    ReshardGroups,
    UpdateState,
    allgather_swap,
    eq3_inputs,
    measured_redundant_bytes,
    naive_reshard,
    param_meta,
)

WORLD = 4
METHODS = ("naive", "allgather_swap")
DENSE = (ParallelLayout(tp=2, dp=2), ParallelLayout(tp=1, dp=4))
MOE = (ParallelLayout(tp=2, dp=2, ep=2), ParallelLayout(tp=1, dp=4, ep=4))
# name -> (architecture, config kwargs); sizes chosen to span ~6M-64M parameters on a small machine
MODELS: dict[str, tuple[str, dict[str, int]]] = {
    "qwen2-6m": ("qwen2", {"vocab_size": 4096, "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4}),
    "qwen2-21m": ("qwen2", {"vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4}),
    "qwen2-64m": ("qwen2", {"vocab_size": 16384, "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 6}),
    "qwen3-moe-18m": ("qwen3_moe", {"vocab_size": 8192, "hidden_size": 256, "intermediate_size": 1024,
                                    "moe_intermediate_size": 512, "num_experts": 8, "num_experts_per_tok": 2,
                                    "num_hidden_layers": 4, "head_dim": 32}),
}
QUICK = ["qwen2-6m", "qwen3-moe-18m"]
TIMEOUT_S = 1800


def build_meta(arch: str, sizes: dict[str, int]) -> dict[str, Any]:
    """Parameter names, shapes and dtypes of a transformers model built on the meta device."""
    if arch == "qwen2":
        from transformers.models.qwen2 import Qwen2Config as Config
        from transformers.models.qwen2 import Qwen2ForCausalLM as Model
    else:
        from transformers.models.qwen3_moe import Qwen3MoeConfig as Config
        from transformers.models.qwen3_moe import Qwen3MoeForCausalLM as Model
    config = Config(num_attention_heads=8, num_key_value_heads=4, **sizes)
    with torch.device("meta"):
        return param_meta(Model(config))


def update_state(partition: ModelPartition, layout: ParallelLayout, rank: int) -> UpdateState:
    """This rank's update shards, random grads and AdamW state after one step."""
    seeded = torch.Generator().manual_seed(0)
    weights = {}
    for name, meta in partition.meta.items():
        full = torch.randn(meta.shape, generator=seeded)
        shard = partition.shard(name, full, layout, rank)
        if shard is not None:
            weights[name] = torch.nn.Parameter(shard)
    for w in weights.values():
        w.grad = torch.randn(w.shape, generator=seeded)
    optimizer = torch.optim.AdamW(list(weights.values()), lr=1e-3)
    optimizer.step()
    return UpdateState(weights, optimizer)


def run_once(method: str, partition: ModelPartition, layouts: tuple[ParallelLayout, ParallelLayout],
             groups: ReshardGroups, bucket_bytes: int, rank: int) -> dict[str, Any]:
    update, gen = layouts
    state = update_state(partition, update, rank)
    ledger = MemoryLedger("cpu", rank)
    dist.barrier()
    if method == "naive":
        result = naive_reshard(state, partition, update, gen, groups, ledger=ledger)
    else:
        result = allgather_swap(state, partition, update, gen, groups, bucket_bytes=bucket_bytes, ledger=ledger)
    record = {
        "gen_peak_bytes": ledger.peak("generation"),
        "reshard_peak_bytes": ledger.peak("reshard"),
        "redundant_bytes": measured_redundant_bytes(state.weights.values(), result.generation_weights.values(), "cpu"),
        "temp_peak_bytes": result.temp_peak_bytes,
        "buckets": result.buckets,
    }
    return {**record, **finish_generation(result, ledger)}


def worker(rank: int, store: str, models: list[str], bucket_bytes: int, repeats: int, results: Any) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
        groups = {str(DENSE[0]): ReshardGroups(DENSE[0]), str(MOE[0]): ReshardGroups(MOE[0])}
        for model in models:
            arch, sizes = MODELS[model]
            layouts = MOE if arch == "qwen3_moe" else DENSE
            partition = ModelPartition(build_meta(arch, sizes))
            for method in METHODS:
                runs = [run_once(method, partition, layouts, groups[str(layouts[0])], bucket_bytes, rank)
                        for _ in range(repeats)]
                results.put(("ok", rank, (model, method, runs)))
        dist.destroy_process_group()
        results.put(("done", rank, None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put(("error", rank, traceback.format_exc()))


def summarize(model: str, method: str, per_rank: list[list[dict[str, Any]]], bucket_bytes: int) -> dict[str, Any]:
    """One record: memory maxima over ranks (sums where noted), timings as medians over repeats of the max over ranks."""
    arch, sizes = MODELS[model]
    update, gen = MOE if arch == "qwen3_moe" else DENSE
    partition = ModelPartition(build_meta(arch, sizes))
    eq3 = eq3_inputs(partition, update, gen)
    first = [runs[0] for runs in per_rank]

    def timing(key: str) -> float:
        return statistics.median(max(runs[i][key] for runs in per_rank) for i in range(len(per_rank[0])))

    return {
        "method": method, "model": model,
        "params": sum(math.prod(m.shape) for m in partition.meta.values()),
        "update_layout": str(update), "gen_layout": str(gen), "world": WORLD,
        "gen_peak_bytes": max(r["gen_peak_bytes"] for r in first),
        "gen_weights_bytes": max(r["gen_weights_bytes"] for r in first),
        "update_state_bytes_in_gen": max(r["update_state_bytes_in_gen"] for r in first),
        "reshard_peak_bytes": max(r["reshard_peak_bytes"] for r in first),
        "redundant_bytes": sum(r["redundant_bytes"] for r in first),
        "redundant_bytes_per_rank": max(r["redundant_bytes"] for r in first),
        "predicted_redundant_bytes": eq3.total,
        "predicted_redundant_bytes_per_rank": eq3.per_rank,
        "temp_peak_bytes": max(r["temp_peak_bytes"] for r in first),
        "bucket_bytes": bucket_bytes if method == "allgather_swap" else None,
        "buckets": first[0]["buckets"],
        "host_bytes": max(r["host_bytes"] for r in first),
        "reshard_s": timing("reshard_s"), "swap_s": timing("swap_s"), "swap_back_s": timing("swap_back_s"),
        "repeats": len(per_rank[0]),
    }


def run(models: list[str], bucket_bytes: int, repeats: int) -> list[dict[str, Any]]:
    """Start the 4 ranks once (fork: torch is already imported), collect every (model, method)."""
    import torch._dynamo  # noqa: F401 - AdamW imports it on first use; once here, not in every rank

    results_q = multiprocessing.get_context("fork").Queue()
    collected: dict[tuple[str, str], dict[int, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        procs = mp.start_processes(worker, args=(os.path.join(tmp, "store"), models, bucket_bytes, repeats, results_q),
                                   nprocs=WORLD, join=False, start_method="fork")
        done: set[int] = set()
        try:
            while len(done) < WORLD:
                try:
                    status, rank, payload = results_q.get(timeout=TIMEOUT_S)
                except queue.Empty:
                    raise TimeoutError(f"ranks {sorted(set(range(WORLD)) - done)} sent nothing for {TIMEOUT_S} s") from None
                if status == "error":
                    raise RuntimeError(f"rank {rank} failed:\n{payload}")
                if status == "done":
                    done.add(rank)
                    continue
                model, method, runs = payload
                collected.setdefault((model, method), {})[rank] = runs
                if len(collected[(model, method)]) == WORLD:
                    print(f"{model} {method}: done", file=sys.stderr, flush=True)
            exit_by = time.monotonic() + 60
            while not procs.join(timeout=max(exit_by - time.monotonic(), 0.1)):
                if time.monotonic() > exit_by:
                    raise TimeoutError("benchmark ranks finished but did not all exit within 60 s")
        finally:
            for p in procs.processes:
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=10)
    return [summarize(model, method, [collected[(model, method)][r] for r in range(WORLD)], bucket_bytes)
            for model in models for method in METHODS]


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def print_table(results: list[dict[str, Any]]) -> None:
    header = (f"{'model':<17}{'update':<12}{'gen':<12}{'method':<16}{'params':>8}{'gen peak':>10}{'upd state':>10}{'redundant':>10}"
              f"{'Eq.(3)':>9}{'temp peak':>10}{'bucket':>8}{'reshard s':>10}{'swap s':>8}{'back s':>8}")
    print("MiB per rank except redundant / Eq.(3) (sum over the 4 ranks); params in millions")
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['model']:<17}{r['update_layout']:<12}{r['gen_layout']:<12}{r['method']:<16}{r['params'] / 1e6:>8.1f}{_mib(r['gen_peak_bytes']):>10}"
              f"{_mib(r['update_state_bytes_in_gen']):>10}{_mib(r['redundant_bytes']):>10}"
              f"{_mib(r['predicted_redundant_bytes']):>9}{_mib(r['temp_peak_bytes']):>10}{_mib(r['bucket_bytes']):>8}"
              f"{r['reshard_s']:>10.3f}{r['swap_s']:>8.3f}{r['swap_back_s']:>8.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}, one repeat")
    parser.add_argument("--bucket-mb", type=float, default=16.0, help="allgather-swap bucket size in MiB")
    parser.add_argument("--repeats", type=int, default=3, help="runs per model and method (timings: median)")
    parser.add_argument("--megatron", action="store_true", help="real megatron-core shards (TP2, PP2, TP2xPP2; "
                        "Qwen3-MoE at EP1 and EP2)")
    parser.add_argument("--moe-only", action="store_true", help="with --megatron: only the Qwen3-MoE EP cases")
    args = parser.parse_args(argv)
    models = QUICK if args.quick else list(MODELS)
    repeats = 1 if args.quick else args.repeats
    bucket_bytes = int(args.bucket_mb * 2**20)
    started = time.perf_counter()
    if args.megatron:
        from benchmarks import reshard_megatron

        results = reshard_megatron.run(args.quick, bucket_bytes, repeats, moe_only=args.moe_only)
    else:
        results = run(models, bucket_bytes, repeats)
    write_results(args.out, results, torch=torch.__version__, backend="gloo", device="cpu (tracked tensors)",
                  world=WORLD, wall_s=round(time.perf_counter() - started, 1))
    print_table(results)
    if args.megatron:
        reshard_megatron.print_ep_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
