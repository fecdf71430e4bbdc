"""Samplers: balanced DP splits of DockBatches, group splits, concat."""


import pytest
import torch
from tensordict import TensorDict

from dockflow.dock import (
    DockBatch,
    DockInvalid,
    concat_batches,
    split_balanced,
    split_groups,
)


def batch(indices, lengths) -> DockBatch:
    n = len(indices)
    return DockBatch(
        indices=list(indices),
        data=TensorDict({"x": torch.tensor(list(indices)).unsqueeze(1).repeat(1, 3)}, batch_size=[n]),
        meta={"response_length": torch.tensor(lengths), "prompt_id": torch.tensor([i // 4 for i in indices])},
    )


def test_split_balanced_keeps_rows_with_their_indices():
    lengths = [5, 100, 7, 80, 3, 90, 1, 60]
    parts = split_balanced(batch(range(8, 16), lengths), 2)
    assert [len(p) for p in parts] == [4, 4]
    assert sorted(i for p in parts for i in p.indices) == list(range(8, 16))
    for p in parts:
        assert p.indices == sorted(p.indices)
        assert p.data["x"][:, 0].tolist() == p.indices
        assert p.meta["response_length"].tolist() == [lengths[i - 8] for i in p.indices]
    totals = [int(p.meta["response_length"].sum()) for p in parts]
    assert abs(totals[0] - totals[1]) <= 20


def test_split_balanced_keeps_groups_together_and_rejects_uneven():
    parts = split_balanced(batch(range(16), list(range(16))), 2, group_size=4)
    for p in parts:
        assert {i // 4 for i in p.indices} == {i // 4 for i in p.indices[::4]}
        assert len(p) == 8
    with pytest.raises(DockInvalid, match="evenly"):
        split_balanced(batch(range(12), [1] * 12), 2, group_size=4)
    with pytest.raises(DockInvalid, match="no metadata or column"):
        split_balanced(batch(range(4), [1] * 4), 2, key="nope")


def test_split_balanced_on_mask_column_counts_nonzeros():
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0]])
    b = DockBatch(indices=[0, 1, 2, 3], data=TensorDict({"mask": mask}, batch_size=[4]), meta={})
    parts = split_balanced(b, 2, key="mask")
    assert sorted(sum(int(mask[i].sum()) for i in p.indices) for p in parts) == [5, 5]


def test_split_groups_and_concat_round_trip():
    b = batch(range(4, 12), list(range(8)))
    groups = split_groups(b, 4)
    assert [g.indices for g in groups] == [[4, 5, 6, 7], [8, 9, 10, 11]]
    merged = concat_batches(list(reversed(groups)))
    assert merged.indices == b.indices
    assert torch.equal(merged.data["x"], b.data["x"])
    assert torch.equal(merged.meta["response_length"], b.meta["response_length"])
    with pytest.raises(DockInvalid, match="not one whole group"):
        split_groups(batch([1, 2, 3, 4], [0] * 4), 4)
