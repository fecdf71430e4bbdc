"""Smoke runs of the dock benchmarks (``benchmarks/dock.py --quick --nodes 2 --backends centralized,dock``, the same
under the bandwidth model, and ``benchmarks/dock_sweep.py`` at S = 1, 2): both DockFlow backends on simulated
clusters (the real runs use 4 nodes, and 1-8 for the sweep) write well-formed records. Timings are not
asserted. TransferQueue is left to the full benchmark: its start-up alone takes about a minute on this
2-core machine, which the test suite's budget cannot spare."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NODES = 2
FIELDS = {"backend", "samples", "seq_tokens", "wall_s", "cpu_s", "busiest_bytes", "p50_get_s", "p99_get_s",
          "tcv_bytes_eq2", "tcv_bytes_eq4", "nic_mbps", "nodes", "busiest_link_s"}
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}  # token auth as the whole suite (tests/conftest.py)


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=580)


@pytest.mark.slow
@pytest.mark.bench  # about a minute: outside the CI budget; run with `pytest -m bench`
def test_quick_benchmark_writes_one_record_per_backend(tmp_path):
    out = tmp_path / "dock.json"
    done = run("benchmarks.dock", "--quick", "--nodes", str(NODES), "--backends", "centralized,dock", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert sorted(r["backend"] for r in results) == ["centralized", "dock"]
    for record in results:
        assert FIELDS <= set(record)
        assert record["wall_s"] > 0 and record["cpu_s"] > 0 and record["busiest_bytes"] > 0
        assert 0 < record["p50_get_s"] <= record["p99_get_s"]
        assert record["tcv_bytes_eq4"] < record["tcv_bytes_eq2"]
    by_backend = {r["backend"]: r for r in results}
    # The distributed dock's busiest process moves 1/S of the centralized buffer's bytes plus metadata (S = 2).
    assert by_backend["dock"]["busiest_bytes"] < by_backend["centralized"]["busiest_bytes"] * (1 / NODES + 0.1)
    assert "busiest MB" in done.stdout
    assert all(r["nic_mbps"] is None and r["nodes"] == NODES and r["busiest_link_s"] == 0 for r in results)


@pytest.mark.slow
@pytest.mark.bench  # about a minute and a half
def test_modelled_benchmark_and_node_sweep_write_their_records(tmp_path):
    out = tmp_path / "modelled.json"
    done = run("benchmarks.dock", "--quick", "--nodes", str(NODES), "--nic-mbps", "100", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert sorted(r["backend"] for r in results) == ["centralized", "dock"]  # TransferQueue is not modelled
    for record in results:
        assert FIELDS <= set(record) and record["nic_mbps"] == 100 and record["nodes"] == NODES
    central = next(r for r in results if r["backend"] == "centralized")
    assert central["busiest_link_s"] > 0  # the other node's worker crossed the buffer's link
    refused = run("benchmarks.dock", "--quick", "--nic-mbps", "100", "--backends", "transferqueue", "--out", str(out))
    assert refused.returncode != 0 and "not modelled" in refused.stderr

    sweep = tmp_path / "sweep.json"
    done = run("benchmarks.dock_sweep", "--nodes", "1,2", "--per-node", "32", "--seq", "256", "--micro", "16",
               "--out", str(sweep))
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(sweep.read_text())["results"]
    assert sorted((r["backend"], r["nodes"], r["samples"]) for r in records) == [
        ("centralized", 1, 32), ("centralized", 2, 64), ("dock", 1, 32), ("dock", 2, 64)]
    assert all(r["linearity"] == 1.0 for r in records if r["nodes"] == 1)
    assert "linearity" in done.stdout
