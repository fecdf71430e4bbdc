"""benchmarks/scale.py: a case too large for the whole logits is skipped, not run; a small case runs in a fresh
process and reports its memory against the fp32 logits (the chunked path below the whole-logits one)."""

import pytest

from benchmarks.scale import run_case, table


def test_a_case_whose_whole_logits_exceed_the_limit_is_skipped_not_run():
    case = {"rows": 16, "width": 2048, "vocab": 151_936, "mode": "update", "path": "trl", "chunk": 512}
    out = run_case(case, max_logits_gib=4.0)
    assert out["skipped"].startswith("whole logits 18.5 GiB")
    assert "skipped" in table([out])


@pytest.mark.bench
def test_a_small_case_runs_and_the_chunked_path_holds_less_than_the_whole_logits():
    base = {"rows": 2, "width": 512, "vocab": 50_000, "mode": "logprobs", "chunk": 128}
    chunked, whole = (run_case({**base, "path": path}, max_logits_gib=4.0) for path in ("chunked", "whole"))
    assert chunked["peak_growth_mb"] < whole["peak_growth_mb"], (chunked, whole)
