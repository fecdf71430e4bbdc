"""Every algorithm on the arithmetic task with the same budget, side by side: held-out accuracy before and after.

Each algorithm runs its example config (``configs/<algorithm>_arith.yaml``) for the same number of
iterations with the same samples per iteration (G x N = 256: 32 prompts x 8 responses, or DPO's 128 pairs
x 2), from the same cached SFT warm start per seed, evaluated greedily on the same 500 held-out test prompts.
DPO also reports the policy's chosen-minus-rejected log-prob margin on held-out pairs. With ``--seeds`` every
algorithm runs once per ``run.seed`` (its own SFT warm start, data draw and sampling) and the table gives the
median gain and its range over the seeds: one seed's result is not a claim.

    python -m benchmarks.algos --out runs/bench_algos.json [--iterations 100] [--only ppo,dpo] [--seeds 0,1,2]

Prints a table and writes ``{"machine": ..., "results": [...], "summary": [...]}``: one record per algorithm and
seed, one summary per algorithm.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from dockflow.config import load_config  # noqa: E402
from dockflow.flow.trainer import train  # noqa: E402

ALGORITHMS = [
    "grpo", "ppo", "dapo", "pf_ppo", "reinforce_pp", "reinforce_pp_baseline", "dpo", "gspo", "rloo", "dr_grpo", "cispo",
]


def run_one(algorithm: str, seed: int, iterations: int, out_dir: str, extra: list[str]) -> dict[str, Any]:
    overrides = [
        f"run.name=bench_{algorithm}_s{seed}",
        f"run.seed={seed}",
        f"run.output_dir={out_dir}",
        f"train.iterations={iterations}",
        "eval.every=0",
        "checkpoint.every=0",
        *extra,
    ]
    cfg = load_config(f"configs/{algorithm}_arith.yaml", overrides)
    shutil.rmtree(Path(out_dir) / cfg.run.name, ignore_errors=True)  # a previous run's checkpoints would be resumed
    start = time.perf_counter()
    summary = train(cfg)
    record = {
        "algorithm": algorithm,
        "seed": seed,
        "iterations": summary["iterations"],
        "samples_per_iteration": cfg.global_batch,
        "accuracy_before": summary["accuracy_before"],
        "accuracy_after": summary["accuracy_after"],
        "accuracy_gain": summary["accuracy_after"] - summary["accuracy_before"],
        "throughput_tps": summary["throughput_tps"],
        "seconds_per_iteration": summary["seconds_per_iteration"],
        "wall_s": time.perf_counter() - start,
        "mlflow_run_id": summary["mlflow_run_id"],
    }
    for key in ("margin_before", "margin_after"):  # what an offline algorithm's recipe adds (DPO)
        if key in summary:
            record[key] = summary[key]
    return record


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per algorithm (in ``ALGORITHMS`` order): the seeds, each seed's gain, and the median and range over the seeds
    of the accuracy before, after and the gain."""
    out = []
    for algorithm in [a for a in ALGORITHMS if any(r["algorithm"] == a for r in results)]:
        runs = sorted((r for r in results if r["algorithm"] == algorithm), key=lambda r: r.get("seed", 0))
        row: dict[str, Any] = {"algorithm": algorithm, "seeds": [r.get("seed", 0) for r in runs],
                               "gains": [r["accuracy_gain"] for r in runs],
                               "iterations": runs[0]["iterations"],
                               "seconds_per_iteration": statistics.median(r["seconds_per_iteration"] for r in runs),
                               "throughput_tps": statistics.median(r["throughput_tps"] for r in runs)}
        for key in ("accuracy_before", "accuracy_after", "accuracy_gain"):
            values = [r[key] for r in runs]
            row[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        out.append(row)
    return out


def _spread(stat: dict[str, float], signed: bool = False) -> str:
    fmt = "{:+.3f}" if signed else "{:.3f}"
    text = fmt.format(stat["median"])
    return text if stat["min"] == stat["max"] else f"{text} [{fmt.format(stat['min'])}, {fmt.format(stat['max'])}]"


def print_table(summary: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Algorithms on 2-digit arithmetic, same budget (held-out greedy accuracy: median [range] "
                  "over seeds)")
    for col in ("algorithm", "seeds", "iters", "before", "after", "gain", "gain per seed", "s/iter", "tok/s/dev"):
        table.add_column(col, justify="right")
    for r in summary:
        table.add_row(
            r["algorithm"],
            ",".join(map(str, r["seeds"])),
            str(r["iterations"]),
            _spread(r["accuracy_before"]),
            _spread(r["accuracy_after"]),
            _spread(r["accuracy_gain"], signed=True),
            " ".join(f"{g:+.3f}" for g in r["gains"]),
            f"{r['seconds_per_iteration']:.2f}",
            f"{r['throughput_tps']:.0f}",
        )
    Console().print(table)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--iterations", type=int, default=100, help="RL iterations per algorithm (the budget)")
    p.add_argument("--only", default=None, help="comma-separated subset of " + ",".join(ALGORITHMS))
    p.add_argument("--seeds", default="0", help="comma-separated run.seed values: each algorithm runs once per seed")
    p.add_argument("--runs-dir", default="runs/bench_algos", help="where the runs are written")
    p.add_argument("overrides", nargs="*", help="extra dotted overrides applied to every algorithm")
    args = p.parse_args(argv)
    algorithms = args.only.split(",") if args.only else ALGORITHMS
    unknown = sorted(set(algorithms) - set(ALGORITHMS))
    if unknown:
        p.error(f"unknown algorithms {unknown}; choose from {ALGORITHMS}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. 0,1,2")
    out_path = Path(args.out)
    # With --only, records of the other algorithms already in --out are kept (a subset can be re-run).
    kept = json.loads(out_path.read_text())["results"] if args.only and out_path.is_file() else []
    results = [r for r in kept if r["algorithm"] not in algorithms]
    for seed in seeds:  # seed-major: a stopped run has every algorithm at the first seeds
        for algorithm in algorithms:
            results.append(run_one(algorithm, seed, args.iterations, args.runs_dir, args.overrides))
            print(json.dumps(results[-1]), flush=True)
            write(out_path, results)
    results.sort(key=lambda r: (ALGORITHMS.index(r["algorithm"]), r.get("seed", 0)))
    write(out_path, results)
    print_table(summarize(results))


def write(path: Path, results: list[dict[str, Any]]) -> None:
    """The JSON so far (after every algorithm, so a crash keeps what finished)."""
    out = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()},
        "command": "python -m benchmarks.algos " + " ".join(sys.argv[1:]),
        "results": results,
        "summary": summarize(results),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
