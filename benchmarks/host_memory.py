"""What keeping freed host memory (``ray.retain_host_memory``) saves a model worker, side by side in one run.

A setup of ``benchmarks/vs_trl.py`` (``tiny``: the demo's model and batch; ``larger``: the 25M Qwen2, 32 x 256 new
tokens) runs its engines for ``--iterations`` rounds of generate-then-update in a fresh process, set up as a model
worker is (``init_worker_process``) with the setting on and off; the processes alternate (on off, off on, ...) for
``--rounds`` rounds so that the machine's drift falls on both. Each process reports, per phase and round, wall
seconds, user and system CPU seconds and minor page faults (``getrusage``), and its peak and final resident memory.
The first round is reported apart: it is when a process without the setting faults in most.

Usage: ``python -m benchmarks.host_memory --out host_memory.json [--setup larger] [--rounds 2] [--iterations 3]``.
Timings are not asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.results_file import write_results

PHASES = ("generate", "update")


def usage() -> tuple[float, float, float, int]:
    """(wall, user CPU, system CPU seconds, minor faults) of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime, r.ru_stime, r.ru_minflt


def measured(fn: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """``fn()`` and what it cost: wall_s, user_s, sys_s, faults."""
    before = usage()
    out = fn()
    after = usage()
    return out, dict(zip(("wall_s", "user_s", "sys_s", "faults"), (b - a for a, b in zip(before, after, strict=True)),
                         strict=True))


def memory_mb() -> dict[str, float]:
    """Peak and current resident memory of this process (Linux /proc), in MiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            fields[{"VmHWM": "peak_rss_mb", "VmRSS": "rss_mb"}[key]] = int(value.split()[0]) / 1024
    return fields


def child(setup_name: str, retain: bool, iterations: int, runs_dir: str) -> dict[str, Any]:
    """In this (fresh) process: the setup's engines under the setting, ``iterations`` rounds measured."""
    from benchmarks.engine_rounds import Engines, tiny_model
    from benchmarks.vs_trl import SETUPS, build_larger_model, setup_config
    from dockflow.models import load_model_and_tokenizer
    from dockflow.workers.host_memory import glibc
    from dockflow.workers.runtime import init_worker_process

    cfg = setup_config(SETUPS[setup_name], iterations, runs_dir, [f"ray.retain_host_memory={str(retain).lower()}"])
    init_worker_process(cfg.ray, cfg.run.seed)
    if setup_name == "larger":
        model_dir = Path(cfg.model.path)
        path = str(model_dir) if (model_dir / "config.json").exists() else build_larger_model(cfg)[0]
        model, tokenizer = load_model_and_tokenizer(path)
    else:
        model, tokenizer = tiny_model(cfg)
    engines = Engines(cfg, model, tokenizer, threads=cfg.ray.torch_threads)
    rounds = []
    for k in range(iterations):
        batch, gen_cost = measured(lambda k=k: engines.generate(k))
        _, update_cost = measured(lambda k=k, batch=batch: engines.update(k, batch))
        rounds.append({"generate": gen_cost, "update": update_cost})
    return {"setup": setup_name, "retain": retain, "glibc": glibc() is not None, "rounds": rounds, **memory_mb()}


def run_child(setup: str, retain: bool, iterations: int, runs_dir: str) -> dict[str, Any]:
    """One fresh process under the setting (the setting is the whole process's); its record."""
    cmd = [sys.executable, "-m", "benchmarks.host_memory", "--child", "--setup", setup, "--iterations",
           str(iterations), "--runs-dir", runs_dir, "--retain", str(retain).lower()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise RuntimeError(f"benchmarks.host_memory child (retain={retain}) failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per setting: the first round's generate and update, and the median of the later rounds, over processes."""
    rows = []
    for retain in (True, False):
        mine = [r for r in records if r["retain"] == retain]
        row: dict[str, Any] = {"retain_host_memory": retain, "processes": len(mine),
                               "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in mine),
                               "rss_mb": statistics.median(r["rss_mb"] for r in mine)}
        for phase in PHASES:
            for key in ("wall_s", "sys_s", "faults"):
                row[f"first_{phase}_{key}"] = statistics.median(r["rounds"][0][phase][key] for r in mine)
                later = [x[phase][key] for r in mine for x in r["rounds"][1:]]
                row[f"{phase}_{key}"] = statistics.median(later) if later else float("nan")
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = ["retain", "1st gen s", "1st gen faults", "gen s", "upd s", "upd sys s", "upd faults", "peak MiB", "end MiB"]
    print(" | ".join(head))
    for r in rows:
        print(" | ".join([str(r["retain_host_memory"]), f"{r['first_generate_wall_s']:.2f}",
                          f"{r['first_generate_faults']:.0f}", f"{r['generate_wall_s']:.3f}", f"{r['update_wall_s']:.3f}",
                          f"{r['update_sys_s']:.2f}", f"{r['update_faults']:.0f}", f"{r['peak_rss_mb']:.0f}",
                          f"{r['rss_mb']:.0f}"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--setup", default="larger", choices=("tiny", "larger"))
    parser.add_argument("--rounds", type=int, default=2, help="alternating pairs of processes (on/off)")
    parser.add_argument("--iterations", type=int, default=3, help="generate-then-update rounds per process")
    parser.add_argument("--runs-dir", default="runs/bench_vs_trl", help="where the larger model is (or is built)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--retain", default="true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.setup, args.retain == "true", args.iterations, args.runs_dir)))
        return
    records = []
    for k in range(args.rounds):
        for retain in ((True, False) if k % 2 == 0 else (False, True)):
            records.append({"round": k, **run_child(args.setup, retain, args.iterations, args.runs_dir)})
    rows = summary(records)
    print_table(rows)
    if args.out:
        write_results(args.out, [*records, *({"summary": r} for r in rows)], setup=args.setup,
                      threads=os.environ.get("OMP_NUM_THREADS"))


if __name__ == "__main__":
    main()
