"""What the Kubeflow pipeline costs over the CLI loop, side by side: the demo config, the same iterations,
through ``dockflow train`` and through the pipeline under ``kfp.local``, repeats alternating.

Both drivers run the same stage loops (``dockflow.flow.stage_loops``); the pipeline's run in a supervisor actor
while kfp.local starts the tasks, one at a time, as processes that attach to them. Seconds per iteration run
from the first iteration's start to the last one's end (the summary's ``seconds_per_iteration``: the mean of the
close-to-close periods the loops measure, the same code in both drivers); start-up (Ray, actors, the SFT cache
read, staging the initial model, kfp.local's task processes) and the end (final model, summary, registry) are
reported beside it as ``startup_s`` and ``wall_s``, not in it. Each driver's figure is the median over repeats.

    python -m benchmarks.pipeline_overhead --out pipeline_overhead.json [--iterations 30] [--repeats 3]

Prints a table and writes ``{"machine": ..., "results": [{"driver": "cli" | "pipeline", "iterations": N,
"s_per_iteration": x, ...}, ...], "summary": [...]}`` (one result per run, then the medians).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from benchmarks.results_file import machine_info  # noqa: E402
from dockflow.config import load_config  # noqa: E402

CONFIG = "configs/grpo_arith.yaml"
DRIVERS = ("cli", "pipeline")


def run_one(driver: str, repeat: int, iterations: int, out_dir: str, extra: list[str]) -> dict[str, Any]:
    """One run of the demo config through ``driver``; its timings."""
    name = f"overhead_{driver}_{repeat}"
    overrides = [f"run.output_dir={out_dir}", f"run.name={name}", f"train.iterations={iterations}",
                 "registry.model_name=null", *extra]
    cfg = load_config(CONFIG, overrides)
    shutil.rmtree(Path(out_dir) / name, ignore_errors=True)  # a previous run's checkpoints would be resumed
    start = time.perf_counter()
    if driver == "cli":
        from dockflow.flow.trainer import train

        summary = train(cfg)
    else:
        from pipelines.launch import run_local

        summary = run_local(CONFIG, overrides, cfg, run_name=name)
    wall = time.perf_counter() - start
    loop_s = summary["seconds_per_iteration"] * summary["iterations"]
    return {"driver": driver, "repeat": repeat, "iterations": summary["iterations"],
            "s_per_iteration": summary["seconds_per_iteration"], "loop_s": loop_s, "wall_s": wall,
            "startup_s": wall - loop_s, "throughput_tps": summary["throughput_tps"],
            "accuracy_before": summary["accuracy_before"], "accuracy_after": summary["accuracy_after"]}


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median seconds per iteration and start-up of each driver, and the pipeline's ratio to the CLI loop."""
    out = []
    for driver in DRIVERS:
        rows = [r for r in results if r["driver"] == driver]
        if rows:
            out.append({"driver": driver, "runs": len(rows),
                        "s_per_iteration": statistics.median(r["s_per_iteration"] for r in rows),
                        "startup_s": statistics.median(r["startup_s"] for r in rows),
                        "wall_s": statistics.median(r["wall_s"] for r in rows)})
    cli = next((r for r in out if r["driver"] == "cli"), None)
    for row in out:
        row["vs_cli"] = row["s_per_iteration"] / cli["s_per_iteration"] if cli else None
    return out


def print_table(results: list[dict[str, Any]], summary: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="CLI loop vs Kubeflow pipeline (kfp.local), same config and iterations")
    for col in ("driver", "repeat", "iterations", "s/iteration", "start-up + end s", "wall s", "accuracy"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(r["driver"], str(r["repeat"]), str(r["iterations"]), f"{r['s_per_iteration']:.3f}",
                      f"{r['startup_s']:.1f}", f"{r['wall_s']:.1f}",
                      f"{r['accuracy_before']:.3f} -> {r['accuracy_after']:.3f}")
    for s in summary:
        table.add_row(f"[b]{s['driver']} median[/b]", "", "", f"{s['s_per_iteration']:.3f}", f"{s['startup_s']:.1f}",
                      f"{s['wall_s']:.1f}", f"{s['vs_cli']:.3f}x CLI" if s["vs_cli"] else "")
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON results file")
    p.add_argument("--iterations", type=int, default=30, help="RL iterations per run (at least 30 for the figure)")
    p.add_argument("--repeats", type=int, default=3, help="runs per driver, alternating")
    p.add_argument("--runs-dir", default="runs/bench_pipeline_overhead", help="where the runs write")
    p.add_argument("overrides", nargs="*", help="extra dotted overrides for both drivers")
    args = p.parse_args(argv)
    if args.iterations < 1 or args.repeats < 1:
        p.error("--iterations and --repeats must be at least 1")
    runs_dir = str(Path(args.runs_dir).resolve())
    results = []
    for repeat in range(args.repeats):
        for driver in DRIVERS if repeat % 2 == 0 else reversed(DRIVERS):  # alternate who goes first
            results.append(run_one(driver, repeat, args.iterations, runs_dir, args.overrides))
            print(json.dumps(results[-1]), flush=True)
    summary = summarise(results)
    print_table(results, summary)
    Path(args.out).write_text(json.dumps({"machine": machine_info(config=CONFIG), "results": results,
                                          "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
