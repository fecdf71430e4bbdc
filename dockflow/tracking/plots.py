"""Learning-curve figures (reward, accuracy, ...) as PNG files, for MLflow artifacts and reports.

    plot_curves({"train/reward_mean": [(0, 0.1), (1, 0.3)], "eval/accuracy": [(0, 0.2)]}, run_dir / "curves.png")
    tracker.log_artifact(run_dir / "curves.png")

Draws on matplotlib's Agg canvas directly, so pyplot's global figure state and GUI backends are never touched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def plot_curves(
    history: Mapping[str, Sequence[tuple[int, float]]], path: str | Path, title: str | None = None, cols: int = 3
) -> Path:
    """One panel per metric (``{key: [(step, value), ...]}``), value against step; writes a PNG at ``path``."""
    if not history:
        raise ValueError("plot_curves needs at least one metric history, got none")
    keys = list(history)
    cols = max(1, min(cols, len(keys)))
    rows = math.ceil(len(keys) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.0 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, key in zip(axes, keys, strict=False):
        points = sorted(history[key])
        steps = [s for s, _ in points]
        values = [v for _, v in points]
        ax.plot(steps, values, marker="o" if len(points) <= 30 else None, markersize=3)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if not points:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    return out
