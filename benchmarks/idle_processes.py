"""What idle Ray worker processes cost a model worker on a small machine, side by side in one run.

The demo's engines (``configs/grpo_arith.yaml``: the tiny Qwen2 and its tokenizer, random weights, 32 prompts x 8 samples, 8 new
tokens, then one GRPO step on the 256 rollouts) run in this process on ``--threads`` torch threads, in blocks of
``--iterations``; blocks alternate between no other actor and ``--actors`` idle asyncio Ray actors (what the dock's
processes are between calls), so load that comes and goes falls on both alike. An idle Ray worker process still
wakes 100 times a second (Ray checks for signals every 10 ms in its main thread); on a machine whose cores all run
the model's OpenMP threads each wake-up may preempt one of them, and the others wait at their next barrier; this
measures whether that shows (one reason the dock runs one process per node, ``dockflow/dock/node_actor.py``).
Timings are not asserted anywhere.

Usage: ``python -m benchmarks.idle_processes --out idle.json [--actors 6] [--blocks 4] [--iterations 10]
[--threads 2]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch

from benchmarks.engine_rounds import Engines, tiny_model
from benchmarks.results_file import write_results
from dockflow.config import load_config


def demo_engines(threads: int) -> Engines:
    """The demo's engines (old log-probs from the rollout, as in the benchmarks against TRL)."""
    cfg = load_config("configs/grpo_arith.yaml", ["train.old_log_prob=rollout"])
    return Engines(cfg, *tiny_model(cfg), threads=threads)


def timed_round(engines: Engines, k: int) -> tuple[float, float]:
    """Round ``k``: (generate_s, update_s)."""
    started = time.perf_counter()
    batch = engines.generate(k)
    generate_s = time.perf_counter() - started
    started = time.perf_counter()
    engines.update(k, batch)
    return generate_s, time.perf_counter() - started


class _Idle:
    async def pid(self) -> int:
        return os.getpid()


def run(actors: int, blocks: int, iterations: int, threads: int) -> list[dict[str, Any]]:
    """Interleaved blocks with 0 and ``actors`` idle actors: per block the median generate and update seconds."""
    import ray

    torch.set_num_threads(threads)
    engines = demo_engines(threads)
    ray.init(address="local", num_cpus=threads, include_dashboard=False, log_to_driver=False)
    idle = ray.remote(num_cpus=0)(_Idle)
    records: list[dict[str, Any]] = []
    k = 0
    try:
        for _ in range(2):  # warm-up, not counted
            timed_round(engines, k)
            k += 1
        for block in range(blocks):
            for count in (0, actors):
                handles = [idle.remote() for _ in range(count)]
                ray.get([h.pid.remote() for h in handles])
                time.sleep(1.0)  # their start-up done
                rounds = [timed_round(engines, k + i) for i in range(iterations)]
                k += iterations
                for h in handles:
                    ray.kill(h)
                records.append({"block": block, "idle_actors": count,
                                "generate_s": statistics.median(r[0] for r in rounds),
                                "update_s": statistics.median(r[1] for r in rounds),
                                "load_avg_1m": os.getloadavg()[0]})
    finally:
        ray.shutdown()
    return records


def summary(records: list[dict[str, Any]], actors: int) -> dict[str, float]:
    """Medians over blocks, and the slow-down with idle actors (their ratio, paired by block)."""
    out: dict[str, float] = {}
    for phase in ("generate_s", "update_s"):
        base = [r[phase] for r in records if r["idle_actors"] == 0]
        loaded = [r[phase] for r in records if r["idle_actors"] == actors]
        out[f"{phase}_none"] = statistics.median(base)
        out[f"{phase}_idle"] = statistics.median(loaded)
        out[f"{phase}_ratio"] = statistics.median(b / a for a, b in zip(base, loaded, strict=True))
    return out


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--actors", type=int, default=6, help="idle actors in the loaded blocks")
    parser.add_argument("--blocks", type=int, default=4, help="pairs of blocks (none, loaded)")
    parser.add_argument("--iterations", type=int, default=10, help="rounds per block")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args(argv)
    records = run(args.actors, args.blocks, args.iterations, args.threads)
    found = summary(records, args.actors)
    print(f"{'idle actors':>12} {'generate s':>11} {'update s':>9}")
    print(f"{0:>12} {found['generate_s_none']:>11.4f} {found['update_s_none']:>9.4f}")
    print(f"{args.actors:>12} {found['generate_s_idle']:>11.4f} {found['update_s_idle']:>9.4f}")
    print(f"{'ratio':>12} {found['generate_s_ratio']:>11.3f} {found['update_s_ratio']:>9.3f}   (median of paired blocks)")
    if args.out:
        write_results(args.out, [*records, {"summary": found}], threads=args.threads, actors=args.actors)


if __name__ == "__main__":
    main()
