"""The ideal (critical-path) time of benchmarks/async.py: a two-stage flow shop with a staleness bound."""

import importlib

bench = importlib.import_module("benchmarks.async")  # "async" is a keyword: no plain import


def stage_times(gen: list[float], train: list[float]) -> list[dict[str, float]]:
    return [{"timing/generate_busy_s": g, "timing/old_log_prob_s": 0.5, "timing/old_log_prob_wait_s": 0.5,
             "timing/update_s": t + 1.0, "timing/update_wait_s": 1.0} for g, t in zip(gen, train, strict=True)]


def test_colocated_stages_add_up():
    assert bench.ideal_seconds(stage_times([2, 2, 2], [1, 1, 1]), 0, colocated=True) == 9


def test_staleness_zero_serialises_and_one_overlaps_generation_with_training():
    history = stage_times([2, 2, 2], [2, 2, 2])
    assert bench.ideal_seconds(history, 0, colocated=False) == 12  # g0 t0 g1 t1 g2 t2
    assert bench.ideal_seconds(history, 1, colocated=False) == 8  # g0, then g_i beside t_(i-1), then t2
    assert bench.ideal_seconds(history, 2, colocated=False) == 8  # the slower stage bounds it anyway


def test_a_slow_generator_bounds_the_overlap():
    assert bench.ideal_seconds(stage_times([3, 3, 3], [1, 1, 1]), 1, colocated=False) == 10  # 3 x 3 + last t
