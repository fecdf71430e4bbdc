"""Smoke run of the dock benchmark (``benchmarks/dock.py --quick --nodes 2 --backends centralized,dock``): both
DockFlow backends on a simulated 2-node cluster (the real runs use 4) write one well-formed record each.
Timings are not asserted. TransferQueue is left to the full benchmark: its start-up alone takes about a
minute on this 2-core machine, which the test suite's budget cannot spare."""

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
          "tcv_bytes_eq2", "tcv_bytes_eq4"}


@pytest.mark.slow
@pytest.mark.bench  # about a minute: outside the CI budget; run with `pytest -m bench`
def test_quick_benchmark_writes_one_record_per_backend(tmp_path):
    out = tmp_path / "dock.json"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    run = subprocess.run([sys.executable, "-m", "benchmarks.dock", "--quick", "--nodes", str(NODES),
                          "--backends", "centralized,dock", "--out", str(out)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=580)
    assert run.returncode == 0, run.stderr[-3000:]
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
    assert "busiest MB" in run.stdout
