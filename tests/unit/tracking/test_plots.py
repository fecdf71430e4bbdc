"""plot_curves writes a real PNG with one panel per metric."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.image import imread

from dockflow.tracking import plot_curves


def test_plot_curves_writes_png(tmp_path: Path) -> None:
    history = {
        "train/reward_mean": [(i, i / 10) for i in range(40)],
        "eval/accuracy": [(0, 0.1), (20, 0.4), (10, 0.3)],
        "train/empty": [],
        "timing/iter_s": [(1, 2.0)],
    }
    out = plot_curves(history, tmp_path / "sub" / "curves.png", title="run x")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = imread(out)
    assert img.shape[0] == 600 and img.shape[1] == 1260  # 2 rows x 3 cols panels at 100 dpi


def test_plot_curves_rejects_empty(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one metric"):
        plot_curves({}, tmp_path / "x.png")
