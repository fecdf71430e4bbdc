"""ControllerState bookkeeping: readiness, lowest-first takes, whole groups, impossible requests, reset."""

import numpy as np
import pytest

from dockflow.dock.api import DockInvalid
from dockflow.dock.controller import ControllerState

COLUMNS = ["prompts", "responses", "rewards"]


def state(capacity: int = 16, group_size: int = 4, columns=("responses",)) -> ControllerState:
    return ControllerState("reward", COLUMNS, capacity, group_size, list(columns))


def test_take_returns_lowest_ready_ascending_and_marks_consumed():
    s = state()
    s.mark_ready(np.array([9, 3, 5, 1]), ["responses"])
    assert s.take(3, ["responses"]).tolist() == [1, 3, 5]
    assert s.take(2, ["responses"]) is None  # only 9 left
    s.mark_ready(np.array([0]), ["responses"])
    assert s.take(2, ["responses"]).tolist() == [0, 9]
    assert s.consumed.sum() == 5


def test_take_needs_every_requested_column():
    s = state()
    s.mark_ready(np.arange(4), ["responses"])
    s.mark_ready(np.array([2, 3]), ["rewards"])
    assert s.take(3, ["responses", "rewards"]) is None
    assert s.take(2, ["responses", "rewards"]).tolist() == [2, 3]
    assert s.take(2, ["responses"]).tolist() == [0, 1]


def test_whole_groups_only_returns_complete_untouched_groups():
    s = state()
    s.mark_ready(np.array([0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11]), ["responses"])  # group 0 lacks 3
    assert s.take(8, ["responses"], whole_groups=True).tolist() == list(range(4, 12))
    assert s.take(4, ["responses"], whole_groups=True) is None
    s.mark_ready(np.array([3]), ["responses"])
    assert s.take(4, ["responses"], whole_groups=True).tolist() == [0, 1, 2, 3]


def test_partly_consumed_group_is_never_returned_whole():
    s = state()
    s.mark_ready(np.arange(8), ["responses"])
    assert s.take(1, ["responses"]).tolist() == [0]
    assert s.take(4, ["responses"], whole_groups=True).tolist() == [4, 5, 6, 7]
    with pytest.raises(DockInvalid, match="can never arrive"):
        s.validate(12, ["responses"], whole_groups=True)  # groups 1-3 are untouched: 12 samples


def test_validate_rejects_impossible_requests():
    s = state()
    with pytest.raises(DockInvalid, match="multiple of group_size"):
        s.validate(6, ["responses"], whole_groups=True)
    with pytest.raises(DockInvalid, match="unknown columns"):
        s.validate(2, ["logits"], whole_groups=False)
    with pytest.raises(DockInvalid, match="positive"):
        s.validate(0, ["responses"], whole_groups=False)
    s.mark_ready(np.arange(10), ["responses"])
    s.take(10, ["responses"])
    s.validate(6, ["responses"], whole_groups=False)
    with pytest.raises(DockInvalid, match="only 6 .* never arrive"):
        s.validate(7, ["responses"], whole_groups=False)


def test_readiness_names_missing_columns_and_counts():
    s = state()
    s.mark_ready(np.arange(6), ["responses"])
    s.mark_ready(np.arange(2), ["rewards"])
    s.take(1, ["responses", "rewards"])
    r = s.readiness(4, ["responses", "rewards"], whole_groups=False)
    assert (r.ready, r.consumed) == (1, 1)
    assert r.missing == {"responses": 10, "rewards": 14}
    message = r.message(2.0)
    assert "'reward'" in message and "rewards (missing for 14)" in message and "only 1 samples" in message


def test_metadata_defaults_updates_and_reset_keep():
    s = state()
    assert s.meta.take(np.array([0, 5]))["prompt_id"].tolist() == [0, 1]
    s.mark_ready(np.array([5, 6]), ["responses"], {"response_length": np.array([7, 9]), "policy_version": np.array([2, 2])})
    taken = s.meta.take(np.array([5, 6]))
    assert taken["response_length"].tolist() == [7, 9] and taken["policy_version"].tolist() == [2, 2]
    s.take(2, ["responses"])
    s.reset(np.array([6]))
    assert not s.consumed.any()
    assert np.flatnonzero(s.ready["responses"]).tolist() == [6]
    kept = s.meta.take(np.array([5, 6]))
    assert kept["response_length"].tolist() == [-1, 9]
    assert kept["age"].tolist() == [0, 1]


def test_capacity_must_hold_whole_groups():
    with pytest.raises(DockInvalid):
        ControllerState("x", COLUMNS, 10, 4)


def test_requests_are_limited_to_registered_columns():
    s = state(columns=("responses",))
    with pytest.raises(DockInvalid, match="registered columns"):
        s.validate(2, ["responses", "rewards"], whole_groups=False)


def test_window_limits_takes_validation_and_resets():
    s = state()  # 16 samples, groups of 4; windows [0, 8) and [8, 16)
    s.mark_ready(np.arange(16), ["responses"])
    assert s.take(2, ["responses"], window=(8, 16)).tolist() == [8, 9]
    with pytest.raises(DockInvalid, match="window \\[8, 16\\]"):
        s.validate(7, ["responses"], False, window=(8, 16))  # 6 left there
    before = (s.reset_count((0, 8)), s.reset_count((8, 16)))
    s.reset(np.array([3]), window=(0, 8))
    assert (s.reset_count((0, 8)), s.reset_count((8, 16))) == (before[0] + 8, before[1])
    assert s.ready["responses"][:8].tolist() == [False] * 3 + [True] + [False] * 4  # only the kept one
    assert s.ready["responses"][8:].all() and s.consumed[8:10].all()  # the other window untouched
    assert s.meta.values["age"][3] == 1 and s.meta.values["age"][8] == 0


def test_take_prefers_the_given_shards_then_fills_from_the_rest():
    owners = np.repeat(np.arange(3), 4)  # 12 samples, shard s owns [4s, 4s + 4)
    s = ControllerState("reward", COLUMNS, 12, 2, ["responses"], owners)
    s.mark_ready(np.arange(12), ["responses"])
    assert s.take(2, ["responses"], prefer=[2]).tolist() == [8, 9]
    assert s.take(4, ["responses"], whole_groups=True, prefer=[2]).tolist() == [0, 1, 10, 11]  # still whole groups
    assert s.take(2, ["responses"], prefer=[0, 1]).tolist() == [2, 3]
    assert s.take(2, ["responses"]).tolist() == [4, 5]  # no preference: lowest first


def lengths_ready(s: ControllerState, lengths: list[int]) -> None:
    s.mark_ready(np.arange(len(lengths)), ["responses"], {"response_length": np.array(lengths)})


def test_dp_shares_split_each_mini_batch_by_response_length():
    s = state(capacity=16, group_size=1)
    lengths = [100, 1, 90, 2, 80, 3, 70, 4, 10, 10, 10, 10, 10, 10, 10, 10]
    lengths_ready(s, lengths)
    first = [s.take(4, ["responses"], dp_share=(r, 2)) for r in (1, 0)]  # rank 1 asks first
    assert sorted(np.concatenate(first).tolist()) == list(range(8))  # the first mini-batch: the 8 lowest
    totals = [int(sum(lengths[i] for i in share)) for share in first]
    assert abs(totals[0] - totals[1]) <= 10  # index order would give 193 vs 157
    assert all(share.tolist() == sorted(share.tolist()) for share in first)
    second = [s.take(4, ["responses"], dp_share=(r, 2)) for r in (0, 1)]
    assert sorted(np.concatenate(second).tolist()) == list(range(8, 16))
    assert s.consumed.all()


def test_dp_shares_come_in_mini_batch_order_whoever_asks_first():
    s = state(capacity=16, group_size=1)
    lengths_ready(s, list(range(16)))
    ahead = [s.take(4, ["responses"], dp_share=(1, 2)) for _ in range(2)]  # rank 1 runs two mini-batches ahead
    behind = [s.take(4, ["responses"], dp_share=(0, 2)) for _ in range(2)]
    for k in range(2):
        assert sorted(np.concatenate([ahead[k], behind[k]]).tolist()) == list(range(8 * k, 8 * k + 8))


def test_dp_share_waits_for_the_whole_mini_batch_and_takes_nothing_before():
    s = state(capacity=16, group_size=1)
    lengths_ready(s, [5] * 6)
    assert s.take(4, ["responses"], dp_share=(0, 2)) is None
    assert not s.consumed.any()


def test_dp_shares_keep_whole_groups_together():
    s = state(capacity=16, group_size=4)
    lengths_ready(s, [50] * 4 + [40] * 4 + [1] * 4 + [2] * 4)
    shares = [s.take(8, ["responses"], whole_groups=True, dp_share=(r, 2)) for r in (0, 1)]
    groups = [sorted({int(i) // 4 for i in share}) for share in shares]
    assert sorted(g for gs in groups for g in gs) == [0, 1, 2, 3]
    assert all(len(share) == 8 and len(gs) == 2 for share, gs in zip(shares, groups, strict=True))
    assert {tuple(gs) for gs in groups} == {(0, 2), (1, 3)}  # 204 vs 168 tokens; index order: 360 vs 12


def test_dp_shares_of_unequal_size_are_refused_and_a_reset_drops_pending_shares():
    s = state(capacity=16, group_size=1)
    lengths_ready(s, [3] * 16)
    s.take(4, ["responses"], dp_share=(0, 2))
    with pytest.raises(DockInvalid, match="equal shares"):
        s.take(2, ["responses"], dp_share=(1, 2))
    s.take(4, ["responses"], dp_share=(0, 2))  # a pending share for rank 1 again
    s.reset(np.array([], dtype=np.int64))
    lengths_ready(s, [3] * 16)
    fresh = s.take(4, ["responses"], dp_share=(1, 2))  # a fresh split, not the stale share
    assert len(fresh) == 4 and s.consumed.sum() == 8  # the stale share would have consumed nothing


def test_dp_share_validation_counts_the_whole_mini_batch():
    s = state(capacity=16, group_size=1)
    with pytest.raises(DockInvalid, match="rank 2"):
        s.validate(4, ["responses"], False, dp_share=(2, 2))
    with pytest.raises(DockInvalid, match="asked for 24"):
        s.validate(12, ["responses"], False, dp_share=(0, 2))
    s.validate(8, ["responses"], False, dp_share=(0, 2))


def test_a_waiting_dp_share_reports_the_whole_mini_batch_it_needs():
    s = state(capacity=16, group_size=1)
    lengths_ready(s, [5] * 6)
    need = s.samples_needed(4, None, (0, 2))
    assert need == 8
    assert "waited 1.0s for 8 samples" in s.readiness(need, ["responses"], False).message(1.0)
    lengths_ready(s, [5] * 8)
    s.take(4, ["responses"], dp_share=(0, 2))
    assert s.samples_needed(4, None, (1, 2)) == 4  # rank 1's share is already split off
