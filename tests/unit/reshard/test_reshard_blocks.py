"""Shard geometry: narrow / concat / pad of shard maps, box intersection, extract and assemble."""

import pytest
import torch

from dockflow.reshard.blocks import Block, BlockMap, assemble, concat, copy_overlap, extract, intersect


def test_narrow_rebases_the_blocks():
    m = BlockMap.full((6, 4)).narrow(0, 2, 3).narrow(1, 1, 2)
    assert m == BlockMap((3, 2), (Block((2, 1), (0, 0), (3, 2)),))
    with pytest.raises(ValueError, match="outside local shape"):
        m.narrow(0, 2, 2)


def test_concat_then_narrow_crosses_block_boundaries():
    full = torch.arange(24.0).reshape(12, 2)
    m = concat([BlockMap.full((12, 2)).narrow(0, 0, 2), BlockMap.full((12, 2)).narrow(0, 8, 2)], dim=0)
    assert torch.equal(extract(full, m), full[[0, 1, 8, 9]])
    middle = m.narrow(0, 1, 2)  # last row of the first block, first row of the second
    assert torch.equal(extract(full, middle), full[[1, 8]])


def test_pad_leaves_zeroed_room_and_marks_padded():
    full = torch.ones(3, 2)
    m = BlockMap.full((3, 2)).narrow(0, 2, 1).pad(0, 2)
    assert m.padded and not BlockMap.full((3, 2)).padded
    assert extract(full, m).tolist() == [[1.0, 1.0], [0.0, 0.0]]


def test_intersect_and_copy_overlap():
    a = Block((0, 0), (0, 0), (4, 4))
    b = Block((2, 3), (5, 0), (4, 4))
    assert intersect(a, b) == ((slice(2, 4), slice(3, 4)), (slice(5, 7), slice(0, 1)))
    assert intersect(a, Block((4, 0), (0, 0), (1, 1))) is None
    full = torch.arange(16.0).reshape(4, 4)
    dst_map = BlockMap.full((4, 4)).narrow(1, 2, 2)  # columns 2, 3
    src_map = BlockMap.full((4, 4)).narrow(0, 1, 2)  # rows 1, 2
    dst = torch.zeros(4, 2)
    assert copy_overlap(dst, dst_map, extract(full, src_map), src_map) == 4
    assert torch.equal(dst[1:3], full[1:3, 2:4]) and not dst[[0, 3]].any()


def test_assemble_checks_shapes():
    m = BlockMap.full((2, 2))
    with pytest.raises(ValueError, match="does not match its map"):
        assemble((2, 2), [(m, torch.zeros(2, 3))])
