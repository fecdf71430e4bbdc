"""Who used the CPU while a benchmark ran: this process tree, grouped by process, and everything else.

On this shared 2-core machine another user's process on one core slows a 2-thread torch run several-fold
(OpenMP threads wait for each other at every parallel region), so a throughput figure means little without
the load beside it. ``CpuLoad`` samples every second in a thread: system-wide busy CPU seconds, and the CPU
seconds of this process and each descendant (a local Ray cluster started here, its workers), grouped by
process title (``ray::ActorWorker``, ``raylet``, ...). ``mark()`` snapshots the totals, so a window (e.g.
the training iterations, without start-up and evaluation) can be cut out afterwards::

    with CpuLoad() as load:
        first = load.mark(); run(); last = load.mark()
    load.cores                       # other processes' mean busy cores over the whole run
    CpuLoad.window(first, last)      # {"seconds": .., "foreign": cores, "ours": {group: cores}}
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil


@dataclass
class Snapshot:
    """Cumulative CPU seconds at one moment: other processes', and ours by process group."""

    at: float
    foreign_s: float
    ours_s: dict[str, float] = field(default_factory=dict)


def process_group(proc: psutil.Process, root: int) -> str:
    """A stable name for a process of our tree: ``driver``, ``ray::<Class>``, or the program's name."""
    if proc.pid == root:
        return "driver"
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return "?"
    if not cmd:
        return proc.name()
    # ray::Class, ray::Class.method, or ray::<actor name>:Class while it starts
    if cmd[0].startswith("ray::"):
        return "ray::" + cmd[0][5:].split(".")[0].split(" ")[0].split(":")[-1]
    prog = os.path.basename(cmd[0])
    args = [a for a in cmd[1:] if a != "-u"]  # python -u: unbuffered
    if prog.startswith("python") and args:  # a Python program: name it by its script or module
        script = args[1] if args[0] == "-m" and len(args) > 1 else args[0]
        return os.path.basename(script)
    return prog


class CpuLoad:
    """Samples CPU use every ``interval_s`` seconds until the ``with`` block ends."""

    def __init__(self, interval_s: float = 1.0):
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._last: dict[int, float] = {}
        self.processes: dict[str, set[int]] = {}  # the pids seen in each group
        self._totals = Snapshot(time.perf_counter(), 0.0)
        self._busy = self._busy_now()
        self._ours_delta()  # baseline: CPU used before the block is not counted
        self.wall_s = 0.0

    @staticmethod
    def _busy_now() -> float:
        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0)

    def _ours_delta(self) -> dict[str, float]:
        """CPU seconds each of our process groups used since the previous sample (per-pid deltas)."""
        me = psutil.Process()
        used: dict[str, float] = {}
        for proc in [me, *me.children(recursive=True)]:
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            group = process_group(proc, me.pid)  # each time: a Ray worker's title changes when it hosts an actor
            if t.user + t.system > self._last.get(proc.pid, 0.0):
                self.processes.setdefault(group, set()).add(proc.pid)
            used[group] = used.get(group, 0.0) + t.user + t.system - self._last.get(proc.pid, 0.0)
            self._last[proc.pid] = t.user + t.system
        return used

    def _sample(self) -> None:
        with self._lock:
            busy = self._busy_now()
            ours = self._ours_delta()
            self._totals.foreign_s += max(0.0, busy - self._busy - sum(ours.values()))
            self._busy = busy
            for group, s in ours.items():
                self._totals.ours_s[group] = self._totals.ours_s.get(group, 0.0) + s

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def mark(self) -> Snapshot:
        """The totals now (sampled on the spot)."""
        self._sample()
        with self._lock:
            return Snapshot(time.perf_counter(), self._totals.foreign_s, dict(self._totals.ours_s))

    @staticmethod
    def window(first: Snapshot, last: Snapshot, top: int = 8) -> dict[str, Any]:
        """Mean busy cores between two marks: other processes', and our ``top`` busiest groups."""
        dt = max(last.at - first.at, 1e-9)
        ours = {g: (s - first.ours_s.get(g, 0.0)) / dt for g, s in last.ours_s.items()}
        busiest = dict(sorted(ours.items(), key=lambda kv: -kv[1])[:top])
        return {"seconds": dt, "foreign": (last.foreign_s - first.foreign_s) / dt, "ours": busiest}

    def __enter__(self) -> CpuLoad:
        self._start = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()
        self.wall_s = time.perf_counter() - self._start

    @property
    def cores(self) -> float:
        """Other processes' mean busy cores over the whole block."""
        return self._totals.foreign_s / max(self.wall_s, 1e-9)


def per_iteration(marks: list[Snapshot], skip: int = 2) -> dict[str, Any]:
    """CPU seconds per iteration by process group, from the end of iteration ``skip`` to the end of the last
    (start-up and the first iterations' warm-up left out), and the wall seconds per iteration."""
    skip = max(1, min(skip, len(marks) - 1))
    first, last, n = marks[skip - 1], marks[-1], len(marks) - skip
    groups = {g: (s - first.ours_s.get(g, 0.0)) / n for g, s in last.ours_s.items()}
    return {
        "iterations": n, "wall_s": (last.at - first.at) / n, "foreign_s": (last.foreign_s - first.foreign_s) / n,
        "cpu_s": dict(sorted(groups.items(), key=lambda kv: -kv[1])),
    }


def idle_probe(actors: int, seconds: float) -> dict[str, Any]:
    """A local Ray cluster with ``actors`` light actors that get no calls: CPU seconds per second of each process
    kind (what a run's processes cost by time alone, whatever they do)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        light = ray.remote(num_cpus=0)(_Idle)
        handles = [light.remote() for _ in range(actors)]
        ray.get([h.ping.remote() for h in handles])
        time.sleep(3.0)  # start-up done
        with CpuLoad() as load:
            first = load.mark()
            time.sleep(seconds)
            last = load.mark()
        return {"actors": actors, "seconds": seconds, "cpu_s_per_s": CpuLoad.window(first, last, top=20)["ours"]}
    finally:
        ray.shutdown()


class _Idle:
    def ping(self) -> int:
        return os.getpid()


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.cpu_load [--config F] [--out F] [section.key=value ...]``: a short demo run (25
    iterations, no evaluation during it) and the CPU seconds each process kind of the run used per iteration.
    ``--idle-actors N``: instead, the CPU that N idle actors and Ray's daemons use per second."""
    import argparse
    import json

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from dockflow.config import load_config
    from dockflow.flow.run_setup import run_dir_of
    from dockflow.flow.trainer import train

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--config", default="configs/grpo_arith.yaml")
    parser.add_argument("--out", default=None, help="write the JSON record here too")
    parser.add_argument("--idle-actors", type=int, default=0, help="instead of a run: this many idle actors, 20 s")
    args, overrides = parser.parse_known_args(argv)
    if args.idle_actors:
        print(json.dumps(idle_probe(args.idle_actors, 20.0), indent=1))
        return
    defaults = ["train.iterations=25", "eval.every=0", "eval.num_prompts=50", "checkpoint.every=0",
                "registry.model_name=null", "run.name=cpu_load", "run.output_dir=runs/cpu_load"]
    cfg = load_config(args.config, defaults + overrides)
    import shutil

    shutil.rmtree(run_dir_of(cfg), ignore_errors=True)
    with CpuLoad() as load:
        marks: list[Snapshot] = []
        train(cfg, on_iteration=lambda step, m: marks.append(load.mark()))
    record = {**per_iteration(marks), "processes": {g: len(p) for g, p in load.processes.items()},
              "load_avg": os.getloadavg(), "background": os.environ.get("DOCKFLOW_BACKGROUND", "1"),
              "overrides": overrides}
    print(json.dumps(record, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
