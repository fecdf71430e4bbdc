"""WarehouseStore and ShardMap: ownership, bit-exact round trips, shape/dtype enforcement, reset."""

import numpy as np
import pytest
import torch

from dockflow.dock.api import DockError, DockInvalid
from dockflow.dock.sharding import ShardMap
from dockflow.dock.warehouse import WarehouseStore
from dockflow.dock.wire import from_wire, to_wire, wire_dtypes

TORCH_COLUMNS = {"input_ids": torch.long, "logp": torch.bfloat16, "reward": torch.float32}
COLUMNS = wire_dtypes(TORCH_COLUMNS)


def test_shard_map_deals_whole_groups_round_robin():
    m = ShardMap(capacity=24, group_size=4, num_shards=3)
    idx = np.arange(24)
    assert m.owner(idx).tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [0] * 4 + [1] * 4 + [2] * 4
    assert m.owned(1).tolist() == [4, 5, 6, 7, 16, 17, 18, 19]
    for shard in range(3):  # local slots are a bijection onto 0..owned-1
        assert sorted(m.local_slot(m.owned(shard)).tolist()) == list(range(8))
    parts = m.split(np.array([17, 0, 5, 9]))
    assert {s: p.tolist() for s, p in parts.items()} == {0: [1], 1: [0, 2], 2: [3]}


def test_write_read_round_trip_is_bit_exact():
    m = ShardMap(16, 2, 2)
    store = WarehouseStore(COLUMNS, m, shard=1)
    idx = m.owned(1)[[3, 0, 5]]
    ids = torch.randint(0, 50_000, (3, 7))
    logp = torch.randn(3, 7).to(torch.bfloat16)
    store.write(idx, {"input_ids": to_wire(ids), "logp": to_wire(logp)})
    out = store.read(idx[[1, 2, 0]], ["input_ids", "logp"])
    assert torch.equal(from_wire(out["input_ids"], torch.long), ids[[1, 2, 0]])
    assert torch.equal(from_wire(out["logp"], torch.bfloat16).view(torch.int16), logp[[1, 2, 0]].view(torch.int16))
    assert store.bytes_in == ids.numel() * 8 + logp.numel() * 2


def test_write_rejects_foreign_indices_bad_dtype_and_shape():
    m = ShardMap(16, 2, 2)
    store = WarehouseStore(COLUMNS, m, shard=0)
    with pytest.raises(DockInvalid, match="does not own"):
        store.write(np.array([2]), {"reward": np.zeros(1, np.float32)})
    with pytest.raises(DockInvalid, match="dtype"):
        store.write(np.array([0]), {"reward": np.zeros(1, np.float64)})
    store.write(np.array([0]), {"input_ids": np.zeros((1, 4), np.int64)})
    with pytest.raises(DockInvalid, match=r"per-sample shape \[5\].*\[4\]"):
        store.write(np.array([1]), {"input_ids": np.zeros((1, 5), np.int64)})
    with pytest.raises(DockError, match="not written"):
        store.read(np.array([1]), ["input_ids"])


def test_reset_keeps_rows_and_shapes_only_when_asked():
    m = ShardMap(8, 1, 1)
    store = WarehouseStore(COLUMNS, m)
    store.write(np.array([0, 1]), {"input_ids": np.array([[1, 2], [3, 4]])})
    store.reset(np.array([1]))
    assert store.read(np.array([1]), ["input_ids"])["input_ids"].tolist() == [[3, 4]]
    with pytest.raises(DockError):
        store.read(np.array([0]), ["input_ids"])
    with pytest.raises(DockInvalid):  # shape kept with the kept sample
        store.write(np.array([2]), {"input_ids": np.zeros((1, 3), np.int64)})
    store.reset(np.array([], dtype=np.int64))
    store.write(np.array([2]), {"input_ids": np.zeros((1, 3), np.int64)})  # new iteration, new shape
    ready, meta = store.snapshot()
    assert ready["input_ids"].tolist() == [2] and meta["prompt_id"].tolist() == list(range(8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int64, torch.bool, torch.uint8])
def test_wire_round_trip_is_bit_exact(dtype):
    t = (torch.randn(4, 3) * 100).to(dtype)
    back = from_wire(to_wire(t), dtype)
    assert back.dtype == dtype and torch.equal(back, t)


def test_shard_map_blocks_keep_micro_batches_on_one_warehouse():
    m = ShardMap(capacity=40, group_size=4, num_shards=2, block=16)
    idx = np.arange(40)
    assert m.owner(idx).tolist() == [0] * 16 + [1] * 16 + [0] * 8
    assert list(m.split(np.arange(16, 32))) == [1]
    for shard in range(2):
        assert sorted(m.local_slot(m.owned(shard)).tolist()) == list(range(len(m.owned(shard))))
