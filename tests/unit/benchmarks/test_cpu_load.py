"""benchmarks/cpu_load.py: CPU seconds per iteration by process group, from marks taken after each iteration."""

from __future__ import annotations

import pytest

from benchmarks.cpu_load import Snapshot, per_iteration


def test_per_iteration_leaves_out_the_first_iterations_and_divides_by_the_rest() -> None:
    marks = [
        Snapshot(10.0, 1.0, {"driver": 1.0, "ray::ActorWorker": 5.0}),  # end of iteration 1 (start-up in it)
        Snapshot(11.0, 1.5, {"driver": 1.1, "ray::ActorWorker": 6.0}),  # end of iteration 2
        Snapshot(12.0, 2.0, {"driver": 1.2, "ray::ActorWorker": 7.0, "ray::DockNodeActor": 0.2}),
        Snapshot(14.0, 2.5, {"driver": 1.4, "ray::ActorWorker": 9.0, "ray::DockNodeActor": 0.4}),
    ]
    out = per_iteration(marks)  # from the end of iteration 2 to the end of iteration 4: 2 iterations
    assert out["iterations"] == 2
    assert out["wall_s"] == pytest.approx(1.5)
    assert out["foreign_s"] == pytest.approx(0.5)
    assert out["cpu_s"] == pytest.approx({"ray::ActorWorker": 1.5, "ray::DockNodeActor": 0.2, "driver": 0.15})
    assert list(out["cpu_s"])[0] == "ray::ActorWorker"  # busiest first
    assert per_iteration(marks[:2])["iterations"] == 1  # too few marks: from the first one
