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
    if cmd[0].startswith("ray::"):
        return cmd[0].split(".")[0].split(" ")[0]
    prog = os.path.basename(cmd[0])
    if prog.startswith("python") and len(cmd) > 1:  # a Python program: name it by its script or module
        script = cmd[2] if cmd[1] == "-m" and len(cmd) > 2 else cmd[1]
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
