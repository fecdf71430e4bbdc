"""Synchronous vs asynchronous scheduling, side by side in one run, on two engines.

Modes: ``sync`` (colocated: the actor worker generates and trains, 2 CPUs) and ``async`` with
``max_staleness`` 1 and 2 (disaggregated: a generator worker with 1 CPU and the actor with 1 CPU, so every
mode has ND = 2 devices in Eq. 5). Engines:

- ``tiny``: the GRPO demo (configs/grpo_arith.yaml, tiny Qwen2, SFT warm start) end to end; on this 2-core
  machine the generator and the trainer share the cores, so the ratio shows what overlap buys when compute
  is the bottleneck; accuracy before/after and the reward curve are reported;
- ``cost_model``: the same workers, dock and schedulers with ``engine.backend: cost_model``
  (dockflow/engines/cost_model.py): generation takes ``decode_s_per_step`` x the longest response of each
  chunk (lognormal lengths, a long tail), training and inference take time per token / CPUs. The workers
  sleep instead of computing, so the schedule itself is measured.

Reported per engine and mode: Eq. 5 throughput over all iterations (tokens / ND / summed iteration
seconds), the idle fraction of each worker group, and for the cost model the ideal throughput of the
critical path: the makespan of the same measured stage times with no overhead (a two-stage flow shop where
generation ``i`` waits for update ``i - 1 - max_staleness``; sync: their sum).

    python -m benchmarks.async --out runs/bench_async.json [--iterations 12] [--engines tiny,cost_model]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from benchmarks.modes import mode_overrides  # noqa: E402
from benchmarks.results_file import write_results  # noqa: E402
from dockflow.config import Config, load_config  # noqa: E402
from dockflow.flow.run_setup import run_dir_of  # noqa: E402
from dockflow.flow.trainer import train  # noqa: E402
from dockflow.workers.resources import build_plan

# (mode, max_staleness, partial rollout): the +pr modes interrupt responses at a token budget
# (rollout.partial.token_budget, PARTIAL_BUDGET per engine; max_age 1, over-provisioned) and finish them with
# newer weights.
MODES = [("sync", 0, False), ("async", 1, False), ("async", 2, False), ("async", 1, True), ("async", 2, True)]
PARTIAL_BUDGET = {"cost_model": 24, "tiny": 4}  # new tokens per call: ~3/8 of max_new_tokens (64 and 8)
# The cost model's explicit times (seconds). Generation is latency-bound (it does not get faster with more CPUs):
# 4 chunks x 64 decode steps (the long tail: the longest of 64 lognormal lengths, mean 28, nearly always hits
# 64) = 2.6 s. Training is per token / CPUs: 2.0 s at 1 CPU, 1.0 s at 2. So generation is 72% of a sync
# iteration, the share RL post-training systems commonly report for rollout. --train-s-per-token changes it
# (2.8e-4 makes training as long as generation at 1 CPU each: plain async's best case, 1.5x at most).
TRAIN_S_PER_TOKEN = 2.0e-4
COST_MODEL = {
    "engine.backend": "cost_model",
    "engine.cost_model.decode_s_per_step": 0.01,
    "engine.cost_model.length_mu": 3.0,
    "engine.cost_model.length_sigma": 0.8,
    "engine.cost_model.prefill_s_per_token": 2e-5,
    "engine.cost_model.infer_s_per_token": 2e-5,
    "rollout.max_new_tokens": 64,
    "rollout.batch_size": 64,
    "sft.enabled": False,  # the modelled policy never changes: no warm start needed
}


def ideal_seconds(history: list[dict[str, float]], staleness: int, colocated: bool) -> float:
    """Makespan of the measured stage times with zero overhead: generation i starts when the generator is
    free and update i - 1 - staleness is done; training i starts when the trainer is free and generation i
    is done. Colocated (one worker), the stages simply add up."""
    gen = [h["timing/generate_busy_s"] for h in history]
    trained = [h.get("timing/old_log_prob_s", 0.0) - h.get("timing/old_log_prob_wait_s", 0.0) + h["timing/update_s"]
               - h["timing/update_wait_s"] for h in history]  # no old_log_prob stage with train.old_log_prob: rollout
    if colocated:
        return sum(gen) + sum(trained)
    gen_done: list[float] = []
    train_done: list[float] = []
    for i, (g, t) in enumerate(zip(gen, trained, strict=True)):
        ready = train_done[i - 1 - staleness] if i - 1 - staleness >= 0 else 0.0
        gen_done.append(max(gen_done[-1] if gen_done else 0.0, ready) + g)
        train_done.append(max(train_done[-1] if train_done else 0.0, gen_done[i]) + t)
    return train_done[-1]


def run_one(engine: str, mode: str, staleness: int, budget: int | None, iterations: int, out_dir: str,
            train_s_per_token: float = TRAIN_S_PER_TOKEN) -> dict[str, Any]:
    partial = budget is not None
    cost = {**COST_MODEL, "engine.cost_model.train_s_per_token": train_s_per_token} if engine == "cost_model" else {}
    overrides = {
        "run.name": f"bench_async_{engine}_{mode}{staleness}{'_partial' if partial else ''}", "run.output_dir": out_dir,
        "train.iterations": iterations, "eval.every": 0, "checkpoint.every": 0,
        **cost, **mode_overrides(mode, staleness),
        **({"rollout.partial.token_budget": budget, "rollout.partial.max_age": 1} if partial else {}),
    }
    cfg: Config = load_config("configs/grpo_arith.yaml", [f"{k}={v}" for k, v in overrides.items()])
    shutil.rmtree(run_dir_of(cfg), ignore_errors=True)  # a previous run's checkpoints would refuse to be overwritten
    history: list[dict[str, float]] = []
    start = time.perf_counter()
    summary = train(cfg, on_iteration=lambda step, metrics: history.append(dict(metrics)))
    tokens = sum(h["rollout/samples"] * (h["rollout/prompt_length"] + h["rollout/response_length"]) for h in history)
    nd = build_plan(cfg).model_cpus()
    seconds = sum(h["timing/iteration_s"] for h in history)
    last = history[-1]
    idle = {k.removeprefix("flow/idle_"): round(v, 4) for k, v in last.items() if k.startswith("flow/idle_")}
    ideal = ideal_seconds(history, staleness, mode == "sync")
    learns = engine == "tiny"
    return {
        "engine": engine,
        "mode": mode,
        "max_staleness": staleness,
        "partial_token_budget": budget,
        "parked_groups": sum(h.get("flow/parked_groups", 0.0) for h in history),
        "overflow_groups": sum(h.get("flow/overflow_groups", 0.0) for h in history),
        "dropped_parked_groups": history[-1].get("flow/dropped_parked_groups_total", 0.0),
        "generate_busy_s": sum(h["timing/generate_busy_s"] for h in history) / len(history),
        "train_s_per_token": train_s_per_token if engine == "cost_model" else None,
        "iterations": len(history),
        "devices": nd,
        "tps": tokens / nd / seconds,
        "ideal_tps": tokens / nd / ideal if engine == "cost_model" else None,
        "seconds_per_iteration": seconds / len(history),
        "idle_fraction": idle,
        "staleness_max": max(h.get("staleness/max", 0.0) for h in history),
        "accuracy_before": summary["accuracy_before"] if learns else None,
        "accuracy_after": summary["accuracy_after"] if learns else None,
        "reward_per_iteration": [h["reward/mean"] for h in history] if learns else None,
        "wall_s": time.perf_counter() - start,
    }


def print_table(results: list[dict[str, Any]]) -> None:
    header = f"{'engine':<12}{'mode':<10}{'stale':>6}{'tps':>10}{'ideal':>10}{'vs sync':>9}{'s/iter':>8}  idle    acc"
    print(header)
    print("-" * len(header))
    sync = {r["engine"]: r["tps"] for r in results if r["mode"] == "sync"}
    for r in results:
        ideal = f"{r['ideal_tps']:.1f}" if r["ideal_tps"] else "-"
        ratio = f"{r['tps'] / sync[r['engine']]:.2f}x" if r["engine"] in sync else "-"
        idle = " ".join(f"{k}={v:.2f}" for k, v in r["idle_fraction"].items())
        acc = f"{r['accuracy_before']:.3f}->{r['accuracy_after']:.3f}" if r["accuracy_before"] is not None else "-"
        mode = r["mode"] + ("+pr" if r.get("partial_token_budget") else "")
        print(f"{r['engine']:<12}{mode:<10}{r['max_staleness']:>6}{r['tps']:>10.1f}{ideal:>10}{ratio:>9}"
              f"{r['seconds_per_iteration']:>8.2f}  {idle}  {acc}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for the results")
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--engines", default="cost_model,tiny")
    parser.add_argument("--runs-dir", default="runs/bench_async")
    parser.add_argument("--train-s-per-token", type=float, default=TRAIN_S_PER_TOKEN,
                        help="the cost model's training seconds per token at 1 CPU")
    parser.add_argument("--partial-budget", type=int, default=None,
                        help=f"partial rollout's token budget (default per engine: {PARTIAL_BUDGET})")
    args = parser.parse_args(argv)
    results = []
    for engine in args.engines.split(","):
        for mode, staleness, partial in MODES:
            budget = (args.partial_budget or PARTIAL_BUDGET[engine]) if partial else None
            record = run_one(engine, mode, staleness, budget, args.iterations, args.runs_dir, args.train_s_per_token)
            results.append(record)
            print(f"{engine} {mode} {staleness}: {record['tps']:.1f} tok/s/device", file=sys.stderr, flush=True)
    write_results(args.out, results, iterations=args.iterations)
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
