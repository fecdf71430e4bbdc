"""Who asks whom for what (``dockflow.dock.protocol``), shared by the Ray dock and the protocol simulator."""

import numpy as np

from dockflow.dock.protocol import local_shards, notify_targets, payload_bytes

INTERESTS = {"reward": ["responses"], "update": ["responses", "rewards"], "ref": ["prompts"]}


def test_a_put_with_metadata_reaches_every_controller():
    assert notify_targets(INTERESTS, ["rewards"], has_meta=True) == ["reward", "update", "ref"]


def test_a_put_without_metadata_reaches_only_its_readers():
    assert notify_targets(INTERESTS, ["rewards"], has_meta=False) == ["update"]
    assert notify_targets(INTERESTS, ["responses"], has_meta=False) == ["reward", "update"]
    assert notify_targets(INTERESTS, ["advantages"], has_meta=False) == []


def test_local_shards_are_preferred_only_when_they_are_some_but_not_all():
    nodes = ["a", "b", "a", "c"]
    assert local_shards(nodes, "a") == [0, 2]
    assert local_shards(nodes, "c") == [3]
    assert local_shards(nodes, "z") is None  # none on this node: plain lowest-first
    assert local_shards(["a", "a"], "a") is None  # all on this node: the same


def test_payload_bytes_counts_every_array():
    idx = np.arange(4, dtype=np.int64)
    data = {"x": np.zeros((4, 8), np.float32)}
    assert payload_bytes(idx, data, None, {}) == 32 + 128
