"""Client-side checks of puts, gets and specs (what is refused before anything is sent)."""

import pytest
import torch
from tensordict import TensorDict

from dockflow.dock import DockInvalid, DockSpec
from dockflow.dock.request import DockRequest
from dockflow.dock.validation import check_get, check_indices, check_put

SPEC = DockSpec(columns={"ids": torch.long, "r": torch.float32}, capacity=8, group_size=2)


def td(**cols):
    n = len(next(iter(cols.values())))
    return TensorDict(cols, batch_size=[n])


def test_valid_put_passes_through():
    index, tensors, meta = check_put(SPEC, [3, 1], td(ids=torch.zeros(2, 5, dtype=torch.long)), {"age": [1, 2]})
    assert index.tolist() == [3, 1] and list(tensors) == ["ids"] and meta["age"].tolist() == [1, 2]


@pytest.mark.parametrize(
    ("indices", "data", "meta", "match"),
    [
        ([0, 1, 2], td(r=torch.zeros(2)), None, "batch_size"),
        ([0, 8], td(r=torch.zeros(2)), None, "out of range"),
        ([-1, 0], td(r=torch.zeros(2)), None, "out of range"),
        ([1, 1], td(r=torch.zeros(2)), None, "repeated"),
        ([0, 1], td(r=torch.zeros(2, dtype=torch.float64)), None, "dtype"),
        ([0, 1], td(logits=torch.zeros(2)), None, "unknown column"),
        ([0, 1], td(r=torch.zeros(2)), {"colour": [1, 2]}, "unknown metadata"),
        ([0, 1], td(r=torch.zeros(2)), {"age": [1]}, "shape"),
        ([0, 1], td(r=torch.zeros(2)), {"age": [0.5, 1.0]}, "integers"),
    ],
)
def test_bad_puts_are_refused(indices, data, meta, match):
    with pytest.raises(DockInvalid, match=match):
        check_put(SPEC, indices, data, meta)


def test_bad_gets_and_specs_are_refused():
    with pytest.raises(DockInvalid, match="multiple of group_size"):
        check_get(SPEC, DockRequest("c", 3, ("r",), whole_groups=True))
    with pytest.raises(DockInvalid, match="capacity"):
        check_get(SPEC, DockRequest("c", 9, ("r",)))
    with pytest.raises(DockInvalid, match="unknown columns"):
        check_get(SPEC, DockRequest("c", 2, ("x",)))
    with pytest.raises(DockInvalid, match="multiple of group_size"):
        DockSpec(columns={"r": torch.float32}, capacity=10, group_size=4)
    with pytest.raises(DockInvalid, match="torch.dtype"):
        DockSpec(columns={"r": "float32"}, capacity=8)
    assert check_indices(SPEC, torch.tensor([2, 0]), "x").tolist() == [2, 0]
