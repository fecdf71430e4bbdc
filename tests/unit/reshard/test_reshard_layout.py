"""ParallelLayout: size checks naming the field, rank <-> coordinates, process-group rank lists."""

import pytest

from dockflow.reshard import ParallelLayout, RankCoords


def test_world_size_defaults_to_the_product_and_str_names_the_layout():
    layout = ParallelLayout(tp=2, dp=2, ep=2)
    assert layout.size == 4
    assert str(layout) == "TP2EP2DP2"
    assert str(ParallelLayout(tp=1, dp=4, fsdp=True)) == "TP1DP4-FSDP"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"tp": 3, "dp": 1, "world_size": 4}, "tp=3 does not divide world_size=4"),
    ({"tp": 1, "dp": 3, "world_size": 4}, "dp=3 does not divide world_size=4"),
    ({"tp": 2, "dp": 1, "pp": 3, "world_size": 4}, "pp=3 does not divide world_size=4"),
    ({"tp": 2, "dp": 1, "world_size": 4}, r"tp\*dp\*pp = 2\*1\*1 = 2 != world_size=4"),
    ({"tp": 1, "dp": 4, "ep": 3}, "ep=3 does not divide dp=4"),
    ({"tp": 0}, "tp must be a positive int"),
    ({"dp": -1}, "dp must be a positive int"),
])
def test_bad_sizes_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ParallelLayout(**kwargs)


def test_for_world_derives_dp_and_names_a_size_that_does_not_divide():
    assert ParallelLayout.for_world(8, tp=2, ep=2) == ParallelLayout(tp=2, dp=4, ep=2, world_size=8)
    assert ParallelLayout(tp=2, dp=2) == ParallelLayout(tp=2, dp=2, world_size=4)  # world_size filled in
    with pytest.raises(ValueError, match="tp=3 does not divide world_size=8"):
        ParallelLayout.for_world(8, tp=3)
    with pytest.raises(ValueError, match="ep=4 does not divide dp=2"):
        ParallelLayout.for_world(8, tp=4, ep=4)


def test_coords_tp_fastest_and_ep_carved_from_dp():
    layout = ParallelLayout(tp=2, dp=2, ep=2)
    assert [layout.coords(r) for r in range(4)] == [
        RankCoords(pp=0, dp=0, ep=0, tp=0), RankCoords(pp=0, dp=0, ep=0, tp=1),
        RankCoords(pp=0, dp=1, ep=1, tp=0), RankCoords(pp=0, dp=1, ep=1, tp=1)]
    pp = ParallelLayout(tp=2, dp=2, pp=2)
    assert pp.coords(5) == RankCoords(pp=1, dp=0, ep=0, tp=1)
    assert all(pp.rank_of(c.pp, c.dp, c.tp) == r for r in range(8) if (c := pp.coords(r)))
    with pytest.raises(ValueError, match="rank 4 is outside layout"):
        layout.coords(4)


def test_group_rank_lists():
    layout = ParallelLayout(tp=2, dp=4, ep=2)  # 8 ranks
    assert layout.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.groups("dp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert layout.groups("ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("expert_dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.groups("tp_ep") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert layout.groups("stage") == [list(range(8))]
    assert ParallelLayout(tp=2, dp=1, pp=2).groups("pp") == [[0, 2], [1, 3]]
    assert layout.group_of("dp", 3) == [1, 3, 5, 7]
    with pytest.raises(ValueError, match="unknown group kind 'cp'"):
        layout.groups("cp")
