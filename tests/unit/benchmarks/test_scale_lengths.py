"""benchmarks/scale_lengths.py: the long tail it draws (median near 300, the longest as asked), a baseline that
computes the same log-probs as today's engine, and (``bench``) a small run of each part end to end."""

import pytest
import torch

from benchmarks.scale_lengths import long_tail_lengths, main, rollouts, whole_logits_log_probs
from dockflow.engines.logprobs import response_log_probs


def test_the_long_tail_has_a_median_near_300_and_the_longest_asked():
    lengths = long_tail_lengths(101, 4096)
    assert max(lengths) == lengths[-1] == 4096
    assert 200 <= sorted(lengths)[50] <= 450


def test_the_before_baseline_computes_todays_log_probs():
    from benchmarks.scale import thin_qwen2

    model = thin_qwen2(500, hidden=32).eval()
    batch = rollouts([5, 17, 9], 500)
    ids, mask, mask_r = batch["input_ids"], batch["attention_mask"], batch["response_mask"]
    with torch.no_grad():
        before = whole_logits_log_probs(model, ids, mask, 17).values
        today = response_log_probs(model, ids, mask, 17).values
    torch.testing.assert_close(before * mask_r, today * mask_r, atol=1e-5, rtol=0)


@pytest.mark.bench
def test_both_parts_run_small_cases(tmp_path):
    main(["--part", "long-tail", "--rows", "4", "--longest", "64", "--budget", "128", "--vocab", "500",
          "--out", str(tmp_path / "b.json")])
    main(["--part", "lengths", "--widths", "8,16", "--vocab", "500", "--out", str(tmp_path / "c.json")])
    import json

    long_tail = json.loads((tmp_path / "b.json").read_text())["results"]
    assert [r["way"] for r in long_tail] == ["before", "samples", "tokens", "tokens+packing"]
    assert all(r["tokens_per_s"] > 0 and r["peak_growth_mb"] >= 0 for r in long_tail), long_tail
    lengths = json.loads((tmp_path / "c.json").read_text())["results"]
    assert [r["width"] for r in lengths] == [8, 16] and all(r["iteration_s"] > 0 for r in lengths), lengths
