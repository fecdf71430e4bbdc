"""The linearity figure of docs/dock.md: the Ray node sweep (``dock_sweep.py``, measured) beside the protocol
simulator's linearity at 16-384 warehouses (``dock_sim.py``), the dock against the centralized buffer.

    python -m benchmarks.dock_plot --sweep sweep.json --sim sim.json --out docs/dock_linearity.png

Draws on matplotlib's Agg canvas directly (as ``dockflow/tracking/plots.py`` does).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

NAMES = {"dock": "distributed dock", "distributed": "distributed dock", "centralized": "centralized buffer"}
STYLE = {"distributed dock": {"color": "tab:blue", "marker": "o"}, "centralized buffer": {"color": "tab:red", "marker": "s"}}
LABEL_OFFSET = {"distributed dock": 6, "centralized buffer": -13}  # labels above the dock's points, below the buffer's


def series(records: list[dict[str, Any]], **match: Any) -> dict[str, list[tuple[int, float]]]:
    """{backend name: [(S, linearity), ...]} of the records that match ``match``."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        if all(r.get(k) == v for k, v in match.items()):
            out.setdefault(NAMES[r["backend"]], []).append((r["nodes"], r["linearity"]))
    return {k: sorted(v) for k, v in out.items()}


def plot(sweep: list[dict[str, Any]], sim: list[dict[str, Any]], path: str | Path, mib_per_s: float = 100.0) -> Path:
    """Two panels, linearity (%) against the node count: measured on Ray, and simulated at cluster scale."""
    fig = Figure(figsize=(10.0, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    panels = [
        (left, series(sweep), f"Ray, simulated nodes on 2 cores, {mib_per_s:g} MiB/s links (measured)", "S (nodes)"),
        (right, series(sim, kind="linearity", mib_per_s=mib_per_s),
         f"protocol simulator, {mib_per_s:g} MB/s links", "S (warehouses = nodes)"),
    ]
    for ax, lines, title, xlabel in panels:
        for name, points in lines.items():
            xs, ys = [p[0] for p in points], [100 * p[1] for p in points]
            ax.plot(xs, ys, label=name, **STYLE[name])
            for x, y in zip(xs, ys, strict=True):
                ax.annotate(f"{y:.0f}%", (x, y), textcoords="offset points", xytext=(0, LABEL_OFFSET[name]),
                            ha="center", fontsize=8, color=STYLE[name]["color"])
        ax.set_xscale("log", base=2)
        xs = sorted({p[0] for points in lines.values() for p in points})
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_ylim(-8, 115)
        ax.axhline(80, color="grey", linestyle=":", linewidth=1)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("sample-flow linearity (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    fig.suptitle("Throughput per node relative to the smallest cluster, batch growing with the cluster", fontsize=11)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", required=True, help="JSON of benchmarks.dock_sweep")
    parser.add_argument("--sim", required=True, help="JSON of benchmarks.dock_sim")
    parser.add_argument("--out", required=True, help="PNG to write")
    args = parser.parse_args(argv)
    sweep = json.loads(Path(args.sweep).read_text())
    sim = json.loads(Path(args.sim).read_text())["results"]
    print(plot(sweep["results"], sim, args.out, sweep["machine"].get("nic_mbps", 100.0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
