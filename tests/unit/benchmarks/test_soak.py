"""The soak benchmark's logic on made-up samples: what a process is, growth after warm-up, the verdict against
the goal, the table and curve shapes, bad arguments. The long run itself is benchmarks/soak.py's (docs/flow.md)."""

from __future__ import annotations

import pytest

from benchmarks import soak


def sample(iteration: int, rss: dict[tuple[str, int], float], store_mb: float = 4.0, refs: float = 10.0) -> dict:
    return {"iteration": iteration, "processes": [{"role": r, "pid": p, "rss_mb": v, "uss_mb": v / 2}
                                                  for (r, p), v in rss.items()],
            "store": {"store_mb": store_mb, "store_objects": 2.0, "spilled_mb": 0.0, "driver_refs": refs}}


def run_of(driver_end: float, raylet_end: float = 30.0, store_end: float = 4.0, n: int = 20) -> list[dict]:
    """n samples every 10 iterations; the driver and the raylet grow linearly to their end values after warm-up
    (iteration 50); the actor is flat; an idle pooled worker comes and goes."""
    out = []
    for k in range(n):
        it = 10 * k
        frac = max(0.0, (it - 50) / (10 * (n - 1) - 50))
        rss = {("driver", 1): 100.0 + frac * (driver_end - 100.0), ("ActorWorker", 7): 700.0 + (k % 2),
               ("ray:raylet", 3): 30.0 + frac * (raylet_end - 30.0)}
        if k % 3 == 0:
            rss[("idle", 100 + k)] = 50.0
        out.append(sample(it, rss, store_mb=4.0 + frac * (store_end - 4.0)))
    return out


@pytest.mark.parametrize(("cmdline", "driver", "role"), [
    (["python", "-m", "benchmarks.soak"], True, "driver"),
    (["ray::ActorWorker.update"], False, "ActorWorker"),
    (["ray::DockNodeActor"], False, "DockNodeActor"),
    (["ray::IDLE"], False, "idle"),
    (["ray::DashboardAgent"], False, "ray:DashboardAgent"),
    (["/venv/lib/python3.12/site-packages/ray/core/src/ray/gcs/gcs_server", "--x=1"], False, "ray:gcs_server"),
    (["/venv/.../ray/core/src/ray/raylet/raylet", "--node"], False, "ray:raylet"),
    (["/bin/bash", "-c", "ls"], False, None),
    ([], False, None),
])
def test_process_role(cmdline: list[str], driver: bool, role: str | None) -> None:
    assert soak.process_role(cmdline, driver) == role


def test_process_memory_finds_this_process() -> None:
    rows = soak.process_memory()
    me = [r for r in rows if r["role"] == "driver"]
    assert len(me) == 1 and me[0]["rss_mb"] > 10 and 0 < me[0]["uss_mb"] <= me[0]["rss_mb"]


def test_growth_after_warmup() -> None:
    flat = [(i, 100.0) for i in range(0, 200, 10)]
    assert soak.growth(flat, 50)["growth_pct"] == 0.0
    rising = [(i, 100.0 + i / 10) for i in range(0, 200, 10)]  # 1 MiB per 10 iterations: 100 MiB per 1000
    g = soak.growth(rising, 50)
    assert g["from_iteration"] == 50 and g["start"] == 106.0 and g["end"] == 118.0
    assert g["growth_pct"] == pytest.approx(100 * 12 / 106)
    assert g["slope_per_1k"] == pytest.approx(100.0)
    assert g["peak"] == 119.0
    assert soak.growth(rising[:7], 50) is None  # 2 samples after warm-up: too few for a start and an end


def test_series_keep_each_process_apart_and_leave_idle_workers_out() -> None:
    samples = run_of(100.0)
    samples[5]["processes"].append({"role": "ActorWorker", "pid": 9, "rss_mb": 1.0, "uss_mb": 1.0})
    series = soak.process_series(samples)
    assert set(series) == {"driver", "ActorWorker#0", "ActorWorker#1", "ray:raylet"}
    assert series["ActorWorker#1"] == [(50, 1.0)] and len(series["driver"]) == 20


def test_verdict_holds_run_processes_to_the_goal_not_rays_own() -> None:
    ok = soak.verdict(run_of(driver_end=104.0, raylet_end=60.0), warmup=50)
    assert ok["rss_ok"] and ok["store_ok"]
    assert ok["rss"]["ray:raylet"]["growth_pct"] > 50  # reported, not held to the goal
    grown = soak.verdict(run_of(driver_end=110.0), warmup=50)
    assert not grown["rss_ok"] and grown["store_ok"]
    assert grown["rss"]["driver"]["growth_pct"] > soak.RSS_GOAL_PCT
    store = soak.verdict(run_of(driver_end=100.0, store_end=40.0), warmup=50)
    assert store["rss_ok"] and not store["store_ok"]
    assert not soak.verdict(run_of(100.0, n=4), warmup=50)["rss_ok"]  # nothing measured is no pass


def test_table_and_curve_shapes(capsys: pytest.CaptureFixture[str]) -> None:
    result = {"mode": "sync", "iterations": 190, "seconds_per_iteration": 0.5, "samples": run_of(110.0)}
    rows = soak.table_rows(result, warmup=50)
    assert [r[1] for r in rows] == ["ActorWorker", "driver", "ray:raylet", "store_mb", "store_objects", "driver_refs"]
    assert all(len(r) == 7 for r in rows)
    curve = soak.curve_rows(result, points=5)
    assert curve[0] == ["iteration", "ActorWorker", "driver", "ray:raylet", "store MiB", "store objects"]
    assert [r[0] for r in curve[1:]] == ["0", "50", "100", "140", "190"]
    soak.print_table([result], warmup=50)
    out = capsys.readouterr().out
    assert "sync: 190 iterations at 0.50 s/it" in out and "FAIL" in out and "object store flat: PASS" in out


@pytest.mark.parametrize("argv", [["--modes", "sync,fast"], ["--every", "0"]])
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert soak.main(argv) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_overrides_keep_the_demo_paths() -> None:
    over = dict(o.split("=", 1) for o in soak.soak_overrides("async", "soak", 2000, "runs/x"))
    assert over["placement.mode"] == "disaggregated" and over["train.max_staleness"] == "1"
    assert over["train.iterations"] == "2000" and over["checkpoint.every"] == "250" and over["eval.every"] == "500"
    assert over["ray.torch_threads"] == "1"


def test_the_figure_draws_each_mode_relative_to_warmup(tmp_path) -> None:
    from benchmarks import soak_plot

    assert soak_plot.relative([(0, 90.0), (50, 100.0), (60, 105.0)], warmup=50) == [(0, -10.0), (50, 0.0), (60, 5.0)]
    assert soak_plot.relative([(300, 10.0), (350, 11.0)], warmup=50)[1] == (350, pytest.approx(10.0))  # starts late
    results = [{"mode": m, "iterations": 190, "samples_per_iteration": 32, "samples": run_of(104.0)}
                for m in ("sync", "async")]
    path = soak_plot.plot(results, 50, tmp_path / "soak.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
