"""benchmarks/pipeline_overhead.py: the medians and the ratio to the CLI loop (the timing is the benchmark's job)."""

from benchmarks.pipeline_overhead import summarise


def test_medians_per_driver_and_the_ratio_to_the_cli_loop():
    runs = [{"driver": d, "s_per_iteration": s, "startup_s": 10.0 + s, "wall_s": 40.0}
            for d, s in [("cli", 0.8), ("pipeline", 0.9), ("cli", 1.0), ("pipeline", 0.88), ("cli", 0.9),
                         ("pipeline", 0.95)]]
    out = {r["driver"]: r for r in summarise(runs)}
    assert out["cli"]["s_per_iteration"] == 0.9 and out["pipeline"]["s_per_iteration"] == 0.9
    assert out["cli"]["vs_cli"] == 1.0 and out["pipeline"]["vs_cli"] == 1.0 and out["pipeline"]["runs"] == 3
    assert summarise([{"driver": "pipeline", "s_per_iteration": 1.0, "startup_s": 1.0, "wall_s": 2.0}])[0]["vs_cli"] is None
