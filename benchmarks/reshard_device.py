"""Resharding on a real accelerator, naive (paper Fig. 3) vs allgather-swap (Fig. 5) side by side: what stays on
the device while it generates, and what the swap costs in time.

One rank on one device (CUDA, or an Ascend NPU), update layout TP1DP1 and generation layout TP1DP1: nothing has
to be gathered, so the comparison isolates the swap. Naive generation reads the update weights in place and
leaves their grads and AdamW's state resident; allgather-swap copies the weights into generation buffers and
swaps the update weights, grads and optimizer state to pinned host memory. Per model and method: the ledger's
bytes by category at generation, the allocator's bytes at generation and its peak over the reshard, and the
swap-out / swap-back seconds with the host <-> device bandwidth they imply (medians over ``--repeats``). Models
are Qwen2.5 shapes at real sizes with random fp32 weights made on the device (nothing is downloaded).

Usage: ``python -m benchmarks.reshard_device --out reshard_device.json [--device cuda] [--models a,b] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.reshard_records import finish_generation
from benchmarks.results_file import write_results
from dockflow.reshard import (
    MemoryLedger,
    ModelPartition,
    ParallelLayout,
    PinnedArena,
    ReshardGroups,
    UpdateState,
    allgather_swap,
    naive_reshard,
    param_meta,
)
from dockflow.reshard.accelerator import accelerator_of

# allgather_swap: new pinned host buffers per swap (torch's pinned allocator); +arena: the engines' path, one
# pinned arena per engine reused by every swap (dockflow/reshard/host_arena.py)
METHODS = ("naive", "allgather_swap", "allgather_swap+arena")
LAYOUT = ParallelLayout(tp=1, dp=1)
# Qwen2.5 shapes (config.json of the public checkpoints): vocab, hidden, MLP, layers, heads, KV heads, tied
MODELS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-3b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                       num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True),
}


def model_meta(name: str) -> dict[str, Any]:
    """Parameter names, shapes and dtypes of the model, built on the meta device."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):
        return param_meta(Qwen2ForCausalLM(Qwen2Config(**MODELS[name])))


def device_state(meta: dict[str, Any], device: torch.device) -> UpdateState:
    """Weights, grads and AdamW's state after one step, all on ``device``."""
    gen = torch.Generator(device=device).manual_seed(0)
    weights = {name: torch.nn.Parameter(0.02 * torch.randn(m.shape, generator=gen, device=device))
               for name, m in meta.items()}
    for w in weights.values():
        w.grad = torch.randn(w.shape, generator=gen, device=device)
    optimizer = torch.optim.AdamW(list(weights.values()), lr=1e-3)
    optimizer.step()
    return UpdateState(weights, optimizer)


def run_once(method: str, meta: dict[str, Any], device: torch.device, groups: ReshardGroups,
             bucket_bytes: int, arena: PinnedArena | None = None) -> dict[str, Any]:
    accel = accelerator_of(device)
    state = device_state(meta, device)
    accel.synchronize(device)
    accel.reset_peak_memory_stats(device)
    before = accel.memory_allocated(device)
    ledger = MemoryLedger(device, 0)
    partition = ModelPartition(meta)
    if method == "naive":
        result = naive_reshard(state, partition, LAYOUT, LAYOUT, groups, ledger=ledger)
    else:
        result = allgather_swap(state, partition, LAYOUT, LAYOUT, groups, bucket_bytes=bucket_bytes, ledger=ledger,
                                arena=arena)
    accel.synchronize(device)
    peaks = ledger.to_metrics()  # the ledger resets the allocator's peak at each step it records
    record = {
        "allocated_before_bytes": before,
        "allocated_in_generation_bytes": accel.memory_allocated(device),
        "allocator_peak_bytes": max(peaks.get(f"memory/{phase}/allocator_peak_bytes", 0) for phase in
                                    ("reshard", "generation")),
        **finish_generation(result, ledger),
    }
    del state, result, ledger
    gc.collect()
    accel.empty_cache()
    return record


def summarize(model: str, method: str, runs: list[dict[str, Any]], device: str) -> dict[str, Any]:
    """Bytes of the first run; times: the first run's (``*_first_s``: pinning happens there) and the median of
    the later runs (an engine's steady state, one swap per iteration)."""
    first = runs[0]
    out = {"model": model, "method": method, "device": device,
           "params": sum(int(torch.Size(m.shape).numel()) for m in model_meta(model).values()),
           **{k: v for k, v in first.items() if "bytes" in k}, "repeats": len(runs)}
    for key in ("reshard_s", "swap_s", "swap_back_s"):
        out[key.replace("_s", "_first_s")] = first[key]
        out[key] = statistics.median(r[key] for r in runs[1:] or runs)
    for key, seconds in (("swap_gb_s", "swap_s"), ("swap_back_gb_s", "swap_back_s")):
        out[key] = first["host_bytes"] / 1e9 / out[seconds] if out[seconds] else None
    return out


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def _rate(gb_s: float | None) -> str:
    return f"{gb_s:>7.1f}" if gb_s else f"{'-':>7}"


def print_table(results: list[dict[str, Any]]) -> None:
    header = (f"{'model':<14}{'method':<22}{'params':>8}{'in gen':>9}{'upd state':>10}{'gen wts':>9}{'peak':>9}"
              f"{'reshard s':>10}{'1st swap':>9}{'swap s':>8}{'GB/s':>7}{'back s':>8}{'GB/s':>7}")
    print("GiB on the device: allocated during generation, of it update state and generation weights (ledger), the "
          "allocator's peak over reshard and generation; params in billions; seconds: median of the repeats after "
          "the first, and the first swap-out (pinning)")
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['model']:<14}{r['method']:<22}{r['params'] / 1e9:>8.2f}{_gib(r['allocated_in_generation_bytes']):>9}"
              f"{_gib(r['update_state_bytes_in_gen']):>10}{_gib(r['gen_weights_bytes']):>9}"
              f"{_gib(r['allocator_peak_bytes']):>9}{r['reshard_s']:>10.3f}{r['swap_first_s']:>9.3f}{r['swap_s']:>8.3f}"
              f"{_rate(r['swap_gb_s'])}"
              f"{r['swap_back_s']:>8.3f}{_rate(r['swap_back_gb_s'])}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--device", default="cuda", choices=("cuda", "npu"))
    parser.add_argument("--models", default="qwen2.5-0.5b,qwen2.5-1.5b", help=f"comma-separated, of {list(MODELS)}")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs per model and method (timings: the first, and the median of the others)")
    parser.add_argument("--bucket-mb", type=float, default=64.0, help="allgather-swap bucket size in MiB")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {list(MODELS)}")
    from dockflow.engines.devices import PROCESS_GROUP_BACKEND, accelerator_module

    module = accelerator_module(args.device)
    if module is None or not module.is_available():
        parser.error(f"--device {args.device}: no such device here")
    module.set_device(0)
    device = torch.device(args.device, 0)
    started = time.perf_counter()
    with tempfile.NamedTemporaryFile() as store:
        dist.init_process_group(PROCESS_GROUP_BACKEND[args.device], init_method=f"file://{store.name}", rank=0,
                                world_size=1, timeout=timedelta(seconds=600))
        groups = ReshardGroups(LAYOUT)
        results = []
        for m in models:
            for method in METHODS:
                arena = PinnedArena(device) if method.endswith("+arena") else None
                runs = [run_once(method, model_meta(m), device, groups, int(args.bucket_mb * 2**20), arena)
                        for _ in range(args.repeats)]
                results.append(summarize(m, method, runs, args.device))
                if arena is not None:
                    arena.close()
        dist.destroy_process_group()
    write_results(args.out, results, torch=torch.__version__, device=module.get_device_name(0),
                  wall_s=round(time.perf_counter() - started, 1))
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
