"""The pure parts of ``benchmarks/reshard_device.py`` (the benchmark itself needs a GPU: docs/reshard.md): the
models' shapes and the summary of repeated runs (the first swap apart from the steady state)."""

import math

import pytest

from benchmarks.reshard_device import model_meta, summarize


def test_the_models_have_the_public_checkpoints_parameter_counts():
    params = sum(math.prod(m.shape) for m in model_meta("qwen2.5-0.5b").values())
    assert params == 494_032_768  # Qwen2.5-0.5B: tied embedding


def test_summary_keeps_the_first_swap_apart_from_the_steady_state():
    def run(swap_s: float) -> dict:
        return {"allocated_in_generation_bytes": 10, "update_state_bytes_in_gen": 0, "gen_weights_bytes": 10,
                "host_bytes": 4 * 10**9, "reshard_s": 0.1, "swap_s": swap_s, "swap_back_s": 0.08}

    out = summarize("qwen2.5-0.5b", "allgather_swap", [run(8.0), run(0.2), run(0.1)], "cuda")
    assert out["swap_first_s"] == 8.0 and out["swap_s"] == pytest.approx(0.15)
    assert out["swap_gb_s"] == pytest.approx(4 / 0.15) and out["swap_back_gb_s"] == pytest.approx(50.0)
    assert out["params"] == 494_032_768 and out["repeats"] == 3
