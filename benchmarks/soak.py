"""A soak run: many iterations of the demo's code paths, with every process's memory and Ray's object store
sampled every ``--every`` iterations, in the synchronous and the asynchronous schedule.

Each mode is one ``dockflow train`` run (``dockflow.flow.trainer.train``) of ``configs/grpo_arith.yaml`` with the
overrides of ``benchmarks/modes.py`` (``sync``: colocated; ``async``: a generator one policy version ahead) and of
the setup (``demo``: the demo's batch as it is; ``soak``: the demo's model and stages on a smaller batch, so that
thousands of iterations fit in a session). Everything else is the demo's: the local Ray cluster, the distributed
dock, the stage loops, evaluation and checkpoints every K iterations, MLflow's local store.

Sampled in the driver's ``on_iteration`` callback: the resident memory (RSS, and USS: the pages only that process
holds) of the driver and of every process under it: the run's Ray actors by class (the actor, generator,
reference, reward worker, the dock's node process, a pipeline run's supervisor), Ray's own (``gcs_server``,
``raylet``, ...); the object store's bytes and objects (the raylet's memory report, what ``ray memory --stats-only``
prints) and the ObjectRefs the driver holds. Growth is measured after ``--warmup`` iterations: the median of the
last 3 samples against the median of the first 3 after warm-up, and a least-squares slope in MiB per 1000
iterations. The goal (issue 45): every run process's RSS grows <= 5 %, and the object store does not grow.

    python -m benchmarks.soak --out benchmarks/results/soak.json [--modes sync,async] [--iterations 2000]
        [--every 50] [--warmup 200] [--setup soak]

Nothing is asserted on timings; the table says PASS or FAIL against the goal.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import psutil  # noqa: E402

from benchmarks.modes import mode_overrides  # noqa: E402
from benchmarks.results_file import write_results  # noqa: E402

RSS_GOAL_PCT = 5.0
EDGE = 3  # samples whose median is the start (after warm-up) and the end of a series
# Both start from the tiny Qwen2's random weights: the SFT warm start runs once before the loop (minutes on a
# loaded 2-core machine) and is not what a soak watches. ``soak``: 8 prompts x 4 samples a round; evaluation on 64
# held-out prompts and a checkpoint (the last 2 kept) every few hundred iterations.
SETUPS: dict[str, dict[str, Any]] = {
    "demo": {"sft.enabled": False},
    "soak": {"sft.enabled": False, "rollout.prompts_per_iter": 8, "rollout.group_size": 4, "rollout.batch_size": 32,
             "train.mini_batch_size": 32, "train.micro_batch_size": 32, "train.infer_batch_size": 32,
             "eval.every": 500, "eval.num_prompts": 64, "eval.batch_size": 64, "checkpoint.every": 250,
             "ray.torch_threads": 1},
}
# Ray's own processes, by the executable's name: reported, not held to the goal (their memory is Ray's).
RAY_SYSTEM = ("gcs_server", "raylet", "dashboard", "log_monitor", "monitor", "runtime_env", "agent")
RAY_AGENTS = ("DashboardAgent", "RuntimeEnvAgent")  # Ray's own processes that carry a ``ray::`` title


def process_role(cmdline: list[str], is_driver: bool) -> str | None:
    """What a process is: "driver", a Ray actor's class ("ActorWorker"), "ray:<name>" for Ray's own processes,
    "idle" for a pooled Ray worker with no actor; None for anything else (a shell, a compiler)."""
    if is_driver:
        return "driver"
    if not cmdline:
        return None
    head = cmdline[0]
    if head.startswith("ray::"):
        name = head.removeprefix("ray::").split(".")[0].split(" ")[0]
        return "idle" if name in ("IDLE", "") else f"ray:{name}" if name in RAY_AGENTS else name
    text = " ".join(cmdline)
    for name in RAY_SYSTEM:
        if f"/{name}" in text or text.startswith(name) or f"{name}.py" in text:
            return f"ray:{name}"
    return None


def process_memory() -> list[dict[str, Any]]:
    """RSS and USS (MiB) of this process and every process under it that ``process_role`` names."""
    me = psutil.Process()
    rows = []
    for proc in [me, *me.children(recursive=True)]:
        try:
            role = process_role(proc.cmdline(), proc.pid == me.pid)
            if role is None:
                continue
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        rows.append({"role": role, "pid": proc.pid, "rss_mb": info.rss / 2**20, "uss_mb": info.uss / 2**20})
    return rows


def object_store() -> dict[str, float]:
    """The cluster's object store (bytes used, objects, spilled) and the ObjectRefs this driver holds."""
    import ray
    from ray._private import internal_api
    from ray._private.state import state

    stats = internal_api.get_memory_info_reply(state, timeout_seconds=30.0).store_stats
    refs = ray._private.worker.global_worker.core_worker.get_all_reference_counts()
    return {"store_mb": stats.object_store_bytes_used / 2**20, "store_objects": float(stats.num_local_objects),
            "spilled_mb": stats.spilled_bytes_total / 2**20, "driver_refs": float(len(refs))}


def process_series(samples: list[dict[str, Any]], field: str = "rss_mb") -> dict[str, list[tuple[int, float]]]:
    """{process name: [(iteration, MiB), ...]} over the samples; idle pooled workers are left out."""
    pids: dict[str, list[int]] = {}
    out: dict[str, list[tuple[int, float]]] = {}
    for s in samples:
        for p in sorted(s["processes"], key=lambda p: p["pid"]):
            if p["role"] == "idle":
                continue
            known = pids.setdefault(p["role"], [])
            if p["pid"] not in known:
                known.append(p["pid"])
            out.setdefault((p["role"], known.index(p["pid"])), []).append((s["iteration"], p[field]))
    return {(role if len(pids[role]) == 1 else f"{role}#{k}"): v for (role, k), v in sorted(out.items())}


def growth(points: list[tuple[int, float]], warmup: int) -> dict[str, float] | None:
    """Growth of one series after ``warmup`` iterations: start and end (medians of ``EDGE`` samples), their
    difference in percent, the least-squares slope per 1000 iterations, the peak. None with too few samples."""
    after = [(i, v) for i, v in points if i >= warmup]
    if len(after) < 2 * EDGE:
        return None
    start = statistics.median(v for _, v in after[:EDGE])
    end = statistics.median(v for _, v in after[-EDGE:])
    xs = [float(i) for i, _ in after]
    slope = statistics.linear_regression(xs, [v for _, v in after]).slope if len(set(xs)) > 1 else 0.0
    return {"start": start, "end": end, "growth_pct": 100.0 * (end - start) / start if start else 0.0,
            "slope_per_1k": 1000.0 * slope, "peak": max(v for _, v in after), "from_iteration": after[0][0]}


def verdict(samples: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Every process's RSS growth and the object store's, and whether the run meets the goal: every run
    process (the driver and the Ray actors, not Ray's own) within ``RSS_GOAL_PCT``, and the object store's
    bytes and the driver's ObjectRefs at the end no higher than at their highest in the first samples."""
    rss = {name: g for name, pts in process_series(samples).items() if (g := growth(pts, warmup)) is not None}
    store = {key: g for key in ("store_mb", "store_objects", "driver_refs")
             if (g := growth([(s["iteration"], s["store"][key]) for s in samples], warmup)) is not None}
    early = [s["store"] for s in samples if s["iteration"] >= warmup][:EDGE]
    run_ok = all(g["growth_pct"] <= RSS_GOAL_PCT for name, g in rss.items() if not name.startswith("ray:"))
    store_ok = bool(store) and all(store[k]["end"] <= max(e[k] for e in early) for k in store)
    return {"rss": rss, "store": store, "rss_ok": run_ok and bool(rss), "store_ok": store_ok}


def soak_overrides(mode: str, setup: str, iterations: int, out_dir: str) -> list[str]:
    """The dotted overrides of one soak run on ``configs/grpo_arith.yaml``."""
    over = {"run.name": f"soak_{setup}_{mode}", "run.output_dir": out_dir, "train.iterations": iterations,
            **mode_overrides(mode, 1), **SETUPS[setup]}
    return [f"{k}={v}" for k, v in over.items()]


def python_growth(baseline: Any, top: int = 12) -> list[str]:
    """The driver's Python allocation sites that grew most since ``baseline`` (a tracemalloc snapshot)."""
    import tracemalloc

    stats = tracemalloc.take_snapshot().compare_to(baseline, "lineno")
    return [str(s) for s in sorted(stats, key=lambda s: -s.size_diff)[:top]]


def run_mode(mode: str, setup: str, iterations: int, every: int, out_dir: str, *,
             on_sample: Callable[[dict[str, Any]], None] | None = None, trace_from: int | None = None
             ) -> dict[str, Any]:
    """One soak run: its samples (taken at iteration 1 and every ``every``-th) and its seconds per iteration.
    ``on_sample``: called with the record so far after each sample (a long run's partial results kept).
    ``trace_from``: trace the driver's Python allocations (tracemalloc) and report the sites that grew from
    this iteration to the end."""
    import tracemalloc

    from dockflow.config import load_config
    from dockflow.flow.run_setup import run_dir_of
    from dockflow.flow.trainer import train

    cfg = load_config("configs/grpo_arith.yaml", soak_overrides(mode, setup, iterations, out_dir))
    shutil.rmtree(run_dir_of(cfg), ignore_errors=True)  # a previous run's checkpoints would refuse to be overwritten
    samples: list[dict[str, Any]] = []
    seconds: list[float] = []
    traced: dict[str, Any] = {}
    started = time.perf_counter()
    if trace_from is not None:
        tracemalloc.start(1)

    def record(summary: dict[str, Any]) -> dict[str, Any]:
        return {"mode": mode, "setup": setup, "iterations": len(seconds), "every": every,
                "samples_per_iteration": cfg.rollout.prompts_per_iter * cfg.rollout.group_size,
                "torch_threads": cfg.ray.torch_threads, "eval_every": cfg.eval.every,
                "checkpoint_every": cfg.checkpoint.every, "seconds_per_iteration": statistics.median(seconds),
                "wall_s": time.perf_counter() - started, "accuracy_before": summary.get("accuracy_before"),
                "accuracy_after": summary.get("accuracy_after"), "finished": "partial" not in summary,
                "samples": samples, **({"python_growth": traced["growth"]} if "growth" in traced else {})}

    def on_iteration(step: int, metrics: dict[str, float]) -> None:
        seconds.append(metrics.get("timing/iteration_s", float("nan")))
        if trace_from is not None and step >= trace_from and "base" not in traced:
            traced["base"] = tracemalloc.take_snapshot()
        if step == 1 or step % every == 0 or step == iterations:
            samples.append({"iteration": step, "t_s": time.perf_counter() - started, "load_1m": os.getloadavg()[0],
                            "processes": process_memory(), "store": object_store()})
            print(f"{mode} {step}/{iterations} {time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True)
            if "base" in traced and step == iterations:  # in the loop: what the run's end frees does not count
                traced["growth"] = python_growth(traced["base"])
            if on_sample is not None:
                on_sample(record({"partial": True}))

    try:
        return record(train(cfg, on_iteration=on_iteration))
    finally:
        tracemalloc.stop()


def table_rows(result: dict[str, Any], warmup: int) -> list[list[str]]:
    """One row per process and per object-store figure: start, end, growth, slope, peak."""
    found = verdict(result["samples"], warmup)
    rows = []
    for name, g in [*found["rss"].items(), *found["store"].items()]:
        unit = "" if name in ("store_objects", "driver_refs") else " MiB"
        rows.append([result["mode"], name, f"{g['start']:.1f}{unit}", f"{g['end']:.1f}{unit}",
                     f"{g['growth_pct']:+.1f}%", f"{g['slope_per_1k']:+.2f}", f"{g['peak']:.1f}"])
    return rows


def print_table(results: list[dict[str, Any]], warmup: int) -> None:
    """The growth table, then each mode's verdict against the goal."""
    head = ["mode", "process / store", "start", "end", "growth", "per 1k it", "peak"]
    rows = [r for res in results for r in table_rows(res, warmup)]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    for row in [head, ["-" * w for w in widths], *rows]:
        print("  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)))
    for res in results:
        found = verdict(res["samples"], warmup)
        print(f"{res['mode']}: {res['iterations']} iterations at {res['seconds_per_iteration']:.2f} s/it; "
              f"RSS growth <= {RSS_GOAL_PCT:g}% after iteration {warmup}: {'PASS' if found['rss_ok'] else 'FAIL'}; "
              f"object store flat: {'PASS' if found['store_ok'] else 'FAIL'}")


def curve_rows(result: dict[str, Any], points: int = 9) -> list[list[str]]:
    """The RSS curve as a table: ``points`` samples spread over the run, a column per process (MiB)."""
    series = process_series(result["samples"])
    picks = sorted({result["samples"][round(k * (len(result["samples"]) - 1) / (points - 1))]["iteration"]
                    for k in range(points)})
    rows = [["iteration", *series, "store MiB", "store objects"]]
    by_it = {s["iteration"]: s["store"] for s in result["samples"]}
    for it in picks:
        cells = [str(it)]
        for pts in series.values():
            found = dict(pts)
            cells.append(f"{found[it]:.0f}" if it in found else "-")
        rows.append([*cells, f"{by_it[it]['store_mb']:.2f}", f"{by_it[it]['store_objects']:.0f}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument("--setup", default="soak", choices=sorted(SETUPS))
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--every", type=int, default=50, help="sample every N iterations")
    parser.add_argument("--warmup", type=int, default=200, help="iterations before growth is measured")
    parser.add_argument("--runs-dir", default="runs/bench_soak")
    parser.add_argument("--trace-python", action="store_true",
                        help="report the driver's Python allocation sites that grew after warm-up (tracemalloc)")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if bad := [m for m in modes if m not in ("sync", "async")]:
        print(f"--modes: {bad[0]!r} is not a mode; choose from sync,async", file=sys.stderr)
        return 2
    if args.every < 1 or args.iterations < 1 or args.warmup < 0:
        print("--every and --iterations must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    results: list[dict[str, Any]] = []

    def save(latest: dict[str, Any] | None = None) -> None:
        if args.out:  # after every sample: a run stopped early still leaves its curve
            write_results(args.out, [{**r, "verdict": verdict(r["samples"], args.warmup)}
                                     for r in [*results, *([latest] if latest else [])]],
                          setup=args.setup, warmup=args.warmup, command=" ".join(sys.argv))

    for mode in modes:
        results.append(run_mode(mode, args.setup, args.iterations, args.every, args.runs_dir, on_sample=save,
                                trace_from=args.warmup if args.trace_python else None))
        save()
    print_table(results, args.warmup)
    for res in results:
        for line in res.get("python_growth", []):
            print(f"{res['mode']} driver allocations since iteration {args.warmup}: {line}")
        print(f"\n{res['mode']}: RSS (MiB) over the run")
        for row in curve_rows(res):
            print(" | ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
