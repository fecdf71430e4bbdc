"""benchmarks.host_memory: what a phase cost, and the per-setting summary of the processes' records."""

from __future__ import annotations

import pytest

from benchmarks.host_memory import measured, summary


def test_measured_returns_the_result_and_counts_the_pages_it_touched():
    out, cost = measured(lambda: bytearray(32 * 2**20))  # 32 MiB of fresh, zero-filled memory
    assert len(out) == 32 * 2**20
    assert cost["faults"] > 1000 and cost["wall_s"] >= 0.0 and set(cost) == {"wall_s", "user_s", "sys_s", "faults"}


def _record(retain: bool, first: float, later: list[float]) -> dict:
    def phase(x: float) -> dict:
        return {"wall_s": x, "sys_s": x / 10, "faults": x * 1000}

    rounds = [{"generate": phase(x), "update": phase(2 * x)} for x in [first, *later]]
    return {"retain": retain, "rounds": rounds, "peak_rss_mb": 100.0, "rss_mb": 90.0 if retain else 50.0}


def test_summary_keeps_the_first_round_apart_and_takes_medians_of_the_rest():
    records = [_record(True, 5.0, [1.0, 2.0]), _record(True, 7.0, [3.0, 4.0]), _record(False, 9.0, [5.0, 5.0])]
    on, off = summary(records)
    assert on["retain_host_memory"] and on["processes"] == 2 and not off["retain_host_memory"]
    assert on["first_generate_wall_s"] == 6.0  # median of 5 and 7
    assert on["generate_wall_s"] == 2.5 and on["update_wall_s"] == 5.0  # median of 1, 2, 3, 4 (x2)
    assert off["update_faults"] == pytest.approx(10_000.0) and on["rss_mb"] == 90.0
