"""A worker's peak memory per iteration: each reading is the peak since the previous one (Linux resets VmHWM)."""

import mmap

import torch

from dockflow.workers.peak_memory import host_peak_mb, peak_memory_metrics


def test_each_reading_is_the_peak_since_the_last_one():
    host_peak_mb()  # start the window
    baseline = host_peak_mb()
    # 256 MiB touched, then unmapped: its own mapping, so no malloc setting of an earlier test keeps it resident
    block = mmap.mmap(-1, 256 * 2**20)
    block.write(b"x" * len(block))
    block.close()
    peak = host_peak_mb()
    after = host_peak_mb()
    assert peak - baseline > 200, (baseline, peak)  # the freed block counts in the window it lived in
    assert after < peak - 200, (peak, after)  # and not in the next one


def test_the_metrics_name_the_role_and_add_no_device_reading_on_cpu():
    metrics = peak_memory_metrics("actor", torch.device("cpu"))
    assert list(metrics) == ["memory/actor_peak_rss_mb"] and metrics["memory/actor_peak_rss_mb"] > 0
