"""MemoryLedger on CPU: bytes from tracked storages (deduplicated), freed and swapped tensors, phases,
peaks, MLflow metrics."""

import pytest
import torch

from dockflow.reshard import CATEGORIES, MemoryLedger, storage_bytes


def test_storage_bytes_counts_each_storage_once():
    a = torch.zeros(100)  # 400 bytes
    assert storage_bytes([a, a[10:20], a.view(10, 10)]) == 400
    assert storage_bytes([a, torch.zeros(5, dtype=torch.float64)]) == 440
    assert storage_bytes([a], torch.device("cuda")) == 0  # other devices do not count


def test_categories_dedupe_across_categories_first_one_wins():
    ledger = MemoryLedger("cpu")
    update = {"w": torch.zeros(10)}
    ledger.track("update_weights", update)
    generation = {"w": update["w"][2:5], "x": torch.zeros(4)}  # a view + a new buffer
    ledger.track("generation_weights", generation)
    by = ledger.bytes_by_category()
    assert by["update_weights"] == 40 and by["generation_weights"] == 16
    assert set(by) == set(CATEGORIES)


def test_tracking_is_weak_and_resized_storages_count_zero():
    ledger = MemoryLedger("cpu")
    temp = torch.zeros(256, dtype=torch.uint8)
    ledger.track("temp_buffer", [temp])
    assert ledger.bytes_by_category()["temp_buffer"] == 256
    del temp
    assert ledger.bytes_by_category()["temp_buffer"] == 0
    w = torch.zeros(8)
    ledger.track("update_weights", [w])
    w.untyped_storage().resize_(0)  # what a swap to host does
    assert ledger.bytes_by_category()["update_weights"] == 0


def test_phases_peaks_and_metrics():
    ledger = MemoryLedger("cpu", rank=3)
    w, g = torch.zeros(100), torch.zeros(50)
    ledger.track("update_weights", [w])
    ledger.track("grads", [g])
    ledger.record("start", "reshard")
    buf = torch.zeros(1000, dtype=torch.uint8)
    ledger.track("temp_buffer", [buf])
    ledger.record("bucket 0", "reshard")
    ledger.clear("temp_buffer")
    ledger.record("ready", "generation")
    assert ledger.phases() == ["reshard", "generation"]
    assert ledger.peak("reshard") == 400 + 200 + 1000
    assert ledger.peak("generation") == 600
    assert ledger.category_peak("reshard", "temp_buffer") == 1000
    metrics = ledger.to_metrics()
    assert metrics["memory/reshard/temp_buffer_bytes"] == 1000.0
    assert metrics["memory/generation/temp_buffer_bytes"] == 0.0
    assert metrics["memory/generation/peak_bytes"] == 600.0
    assert all(isinstance(v, float) for v in metrics.values())
    assert len(metrics) == 2 * (len(CATEGORIES) + 1)  # no allocator metrics on CPU
    assert ledger.snapshots("reshard")[0].allocated is None


def test_errors_name_the_category_or_phase():
    ledger = MemoryLedger("cpu", rank=1)
    with pytest.raises(ValueError, match="unknown ledger category 'kv_cache'"):
        ledger.track("kv_cache", [])
    with pytest.raises(KeyError, match="rank 1 has no snapshot in phase 'generation'"):
        ledger.peak("generation")
