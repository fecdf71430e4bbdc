"""The soak figure of docs/flow.md: per mode, every run process's RSS against its value at the end of warm-up (%,
the goal's band shaded), and the object store's bytes, over the iterations of ``benchmarks/soak.py``'s runs.

    python -m benchmarks.soak_plot benchmarks/results/soak_sync.json benchmarks/results/soak_async.json \
        --out docs/soak_memory.png

Draws on matplotlib's Agg canvas directly (as ``benchmarks/dock_plot.py`` does).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from benchmarks.soak import RSS_GOAL_PCT, process_series


def relative(points: list[tuple[int, float]], warmup: int) -> list[tuple[int, float]]:
    """The series in % of its first value at or after ``warmup`` (its own first value if it starts later)."""
    base = next((v for i, v in points if i >= warmup), points[0][1])
    return [(i, 100.0 * (v - base) / base) for i, v in points]


def plot(results: list[dict[str, Any]], warmup: int, path: str | Path) -> Path:
    """A column per mode: RSS change (%) of the driver and the Ray actors on top, the object store (MiB) below."""
    fig = Figure(figsize=(5.0 * len(results), 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(results), squeeze=False, sharex="col", height_ratios=(3, 1))
    for col, res in enumerate(results):
        top, bottom = axes[0][col], axes[1][col]
        for name, points in process_series(res["samples"]).items():
            if name.startswith("ray:"):
                continue
            xs, ys = zip(*relative(points, warmup), strict=True)
            top.plot(xs, ys, marker=".", label=name)
        top.axhspan(-RSS_GOAL_PCT, RSS_GOAL_PCT, color="tab:green", alpha=0.08, label=f"±{RSS_GOAL_PCT:g}% goal")
        top.axvline(warmup, color="grey", linestyle=":", linewidth=1)
        top.set_title(f"{res['mode']}: {res['iterations']} iterations, {res['samples_per_iteration']} samples each")
        top.set_ylabel(f"RSS vs iteration {warmup} (%)")
        top.legend(fontsize=7, loc="upper left")
        its = [s["iteration"] for s in res["samples"]]
        bottom.plot(its, [s["store"]["store_mb"] for s in res["samples"]], color="tab:purple", marker=".")
        bottom.set_ylabel("object store (MiB)")
        bottom.set_xlabel("iteration")
    fig.savefig(path, dpi=110)
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="JSON files written by benchmarks/soak.py")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    loaded = [json.loads(Path(p).read_text()) for p in args.results]
    results = [r for d in loaded for r in d["results"]]
    if not results:
        print(f"{args.results[0]}: no results to plot; run benchmarks/soak.py first", file=sys.stderr)
        return 2
    plot(results, loaded[0]["machine"]["warmup"], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
