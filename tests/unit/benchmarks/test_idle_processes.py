"""The idle-processes benchmark's summary: medians over blocks and the paired slow-down."""

import pytest

from benchmarks.idle_processes import summary


def test_summary_pairs_each_loaded_block_with_the_block_before_it():
    records = [
        {"block": 0, "idle_actors": 0, "generate_s": 0.10, "update_s": 0.30},
        {"block": 0, "idle_actors": 6, "generate_s": 0.12, "update_s": 0.30},
        {"block": 1, "idle_actors": 0, "generate_s": 0.20, "update_s": 0.40},  # a slower minute for both
        {"block": 1, "idle_actors": 6, "generate_s": 0.22, "update_s": 0.44},
        {"block": 2, "idle_actors": 0, "generate_s": 0.10, "update_s": 0.30},
        {"block": 2, "idle_actors": 6, "generate_s": 0.11, "update_s": 0.33},
    ]
    found = summary(records, actors=6)
    assert found["generate_s_none"] == pytest.approx(0.10) and found["generate_s_idle"] == pytest.approx(0.12)
    assert found["generate_s_ratio"] == pytest.approx(1.1)  # ratios 1.2, 1.1, 1.1
    assert found["update_s_ratio"] == pytest.approx(1.1)  # ratios 1.0, 1.1, 1.1
