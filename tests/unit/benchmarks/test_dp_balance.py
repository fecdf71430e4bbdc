"""benchmarks/dp_balance.py: what each mode gives each rank (the timing itself is the benchmark's job)."""

import pytest

from benchmarks.dp_balance import MODES, WORLD, rollouts, share, summarise


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_splits_the_mini_batch_into_equal_shares(mode):
    batch = rollouts(step=0, rows=32, width=64, mu=2.5, sigma=1.0)
    shares = [share(batch, mode, rank, micro=4) for rank in range(WORLD)]
    assert [s.batch_size[0] for s in shares] == [16, 16]
    keys = sorted(float(a) for s in shares for a in s["advantages"])  # random per row: every row, once
    assert keys == sorted(float(a) for a in batch["advantages"])
    if mode.endswith("sorted"):
        assert all(s["response_length"].tolist() == sorted(s["response_length"].tolist()) for s in shares)
    if mode.startswith("balanced"):
        totals = [int(s["response_length"].sum()) for s in shares]
        assert abs(totals[0] - totals[1]) <= int(batch["response_length"].max())


def test_summary_is_relative_to_index_order():
    records = [{"mode": m, "step": 0, "step_s": s, "padding_fraction": 0.5, "dp_load_imbalance": 1.1}
               for m, s in zip(MODES, (2.0, 1.0, 2.0, 1.0), strict=True)]
    out = summarise(records)
    assert [r["speedup_vs_index"] for r in out] == [1.0, 2.0, 1.0, 2.0]
