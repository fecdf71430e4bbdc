"""DAPO's soft overlong punishment and dynamic-sampling group filter, by hand."""

import pytest
import torch

from dockflow.algos import informative_groups, overlong_penalty


def test_overlong_penalty_by_hand():
    # max_length 20, buffer 4: free up to 16, then (16 - L) / 4, -1 at 20 and beyond; times penalty 0.5
    lengths = torch.tensor([10, 16, 17, 18, 20, 21, 100])
    out = overlong_penalty(lengths, max_length=20, buffer_length=4, penalty=0.5)
    expected = 0.5 * torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0])
    assert torch.allclose(out, expected)
    assert out.dtype.is_floating_point


def test_overlong_penalty_without_buffer_is_a_step():
    out = overlong_penalty(torch.tensor([0, 20, 21]), max_length=20, buffer_length=0, penalty=1.0)
    assert torch.allclose(out, torch.tensor([0.0, 0.0, -1.0]))
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_penalty(torch.tensor([1]), max_length=4, buffer_length=5, penalty=1.0)


def test_informative_groups():
    rewards = torch.tensor([1.0, 0, 1, 0, 0, 0, 0.5, 1, 0.5, 1, 1, 1])
    assert torch.equal(informative_groups(rewards, 3), torch.tensor([True, False, True, False]))
    assert torch.equal(informative_groups(torch.tensor([0.0, 1.0]), 1), torch.tensor([False, False]))
    with pytest.raises(ValueError, match="group_size"):
        informative_groups(torch.ones(5), 2)
