"""``benchmarks.algos``: results over seeds are summarised as median and range per algorithm, never one run."""

from __future__ import annotations

from benchmarks.algos import summarize


def _record(algorithm: str, seed: int, before: float, after: float) -> dict:
    return {"algorithm": algorithm, "seed": seed, "iterations": 100, "accuracy_before": before,
            "accuracy_after": after, "accuracy_gain": after - before, "seconds_per_iteration": 1.0 + seed,
            "throughput_tps": 100.0 * (seed + 1)}


def test_summary_gives_median_and_range_over_seeds_in_algorithm_order() -> None:
    results = [_record("ppo", 0, 0.4, 0.7), _record("grpo", 2, 0.5, 0.6), _record("grpo", 0, 0.4, 0.8),
               _record("grpo", 1, 0.45, 0.75)]
    grpo, ppo = summarize(results)
    assert (grpo["algorithm"], ppo["algorithm"]) == ("grpo", "ppo")
    assert grpo["seeds"] == [0, 1, 2] and [round(g, 3) for g in grpo["gains"]] == [0.4, 0.3, 0.1]
    assert round(grpo["accuracy_gain"]["median"], 6) == 0.3
    assert (round(grpo["accuracy_gain"]["min"], 6), round(grpo["accuracy_gain"]["max"], 6)) == (0.1, 0.4)
    assert grpo["accuracy_before"] == {"median": 0.45, "min": 0.4, "max": 0.5}
    assert grpo["seconds_per_iteration"] == 2.0 and grpo["throughput_tps"] == 200.0
    assert ppo["seeds"] == [0] and ppo["accuracy_after"] == {"median": 0.7, "min": 0.7, "max": 0.7}
