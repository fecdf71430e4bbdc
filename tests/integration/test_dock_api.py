"""The dock's client API on a local Ray cluster, for both backends: streaming gets, whole groups, metadata,
reset, loud failures, and random put/get interleavings by several consumers through real actors."""

from __future__ import annotations

import os
import sys
import time

import pytest
import ray
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from dockflow.dock import (
    DockCancelled,
    DockInvalid,
    DockRequest,
    DockSpec,
    DockTimeout,
    DockUnavailable,
    create_dock,
)

os.environ.setdefault("RAY_AUTH_MODE", "token")  # the token: tests/conftest.py
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

CAPACITY, GROUP, PL, SL = 32, 4, 3, 5
COLUMNS = {"prompts": torch.long, "responses": torch.long, "logp": torch.bfloat16, "rewards": torch.float32}
CONSUMERS = {"reward": ["responses"], "update": ["prompts", "responses", "logp", "rewards"]}


def rows(indices, column: str) -> torch.Tensor:
    """Values that encode (sample, column), so a mix-up or a lost bit shows."""
    idx = torch.as_tensor(list(indices), dtype=torch.long)
    if column == "prompts":
        return idx.unsqueeze(1) * 100 + torch.arange(PL)
    if column == "responses":
        return idx.unsqueeze(1) * 1000 + torch.arange(SL)
    if column == "logp":
        return (idx.unsqueeze(1) * 0.37 - torch.arange(SL) * 1.3).to(torch.bfloat16)
    return idx.to(torch.float32) / 7


def put(dock, indices, columns, meta=None):
    indices = list(indices)
    dock.put(indices, TensorDict({c: rows(indices, c) for c in columns}, batch_size=[len(indices)]), meta=meta)


def assert_rows(batch, columns):
    for c in columns:
        expected = rows(batch.indices, c)
        got = batch.data[c]
        if got.dtype == torch.bfloat16:
            got, expected = got.view(torch.int16), expected.view(torch.int16)
        assert torch.equal(got, expected), c


@pytest.fixture(scope="module")
def ray_local():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Worker below, in worker processes
    ray.init(address="local", num_cpus=1, include_dashboard=False, namespace="dock-api-test")
    yield
    ray.shutdown()


@pytest.fixture(scope="module", params=["distributed", "centralized"])
def dock(request, ray_local):
    spec = DockSpec(columns=COLUMNS, capacity=CAPACITY, group_size=GROUP, backend=request.param,
                    num_warehouses=3, name=f"api-{request.param}", get_timeout_s=30)
    dock = create_dock(spec)
    for consumer, columns in CONSUMERS.items():
        dock.register_consumer(consumer, columns)
    yield dock
    dock.shutdown()


@pytest.fixture
def fresh(dock):
    dock.reset()
    return dock


@ray.remote(num_cpus=0, max_concurrency=4)
class Worker:
    """Producers and consumers in another process; each call gets the (pickled) dock client."""

    def put(self, dock, indices, columns, delay_s: float = 0.0):
        time.sleep(delay_s)
        put(dock, indices, columns)

    def get(self, dock, consumer, batch_size, **kwargs):
        batch = dock.get(DockRequest(consumer, batch_size, **kwargs))
        return batch.indices, {c: t.clone() for c, t in batch.data.items()}


@pytest.fixture(scope="module")
def worker(ray_local):
    return Worker.remote()


def test_get_returns_lowest_ready_ascending_bit_exact(fresh):
    put(fresh, [9, 2, 7, 0, 30], ["responses"], meta={"response_length": [5, 4, 3, 2, 1], "policy_version": [3] * 5})
    batch = fresh.get(DockRequest("reward", 3))
    assert batch.indices == [0, 2, 7]
    assert_rows(batch, ["responses"])
    assert batch.meta["response_length"].tolist() == [2, 4, 3]
    assert batch.meta["policy_version"].tolist() == [3, 3, 3]
    assert batch.meta["prompt_id"].tolist() == [0, 0, 1]
    assert fresh.get(DockRequest("reward", 2)).indices == [9, 30]


def test_consumers_are_independent_and_need_all_their_columns(fresh):
    put(fresh, range(8), ["prompts", "responses", "logp"])
    assert fresh.get(DockRequest("reward", 8)).indices == list(range(8))
    put(fresh, [5, 1, 3, 2], ["rewards"])
    batch = fresh.get(DockRequest("update", 4))
    assert batch.indices == [1, 2, 3, 5]
    assert_rows(batch, CONSUMERS["update"])
    narrow = fresh.get(DockRequest("update", 2, columns=["prompts"]))  # other columns, same consumed set
    assert narrow.indices == [0, 4] and list(narrow.data.keys()) == ["prompts"]


def test_get_streams_as_puts_arrive_from_other_processes(fresh, worker):
    waiting = worker.get.remote(fresh, "update", 8, whole_groups=True)
    ray.get(worker.put.remote(fresh, range(0, 12), ["prompts", "responses", "logp"]))
    time.sleep(0.3)
    assert not ray.wait([waiting], timeout=0)[0]  # rewards still missing: no barrier, just waiting
    ray.get(worker.put.remote(fresh, range(0, 7), ["rewards"], delay_s=0.2))
    assert not ray.wait([waiting], timeout=0.5)[0]  # group 1 is incomplete: 4 whole-group samples so far
    ray.get(worker.put.remote(fresh, [7, 8], ["rewards"]))
    indices, data = ray.get(waiting, timeout=60)
    assert indices == list(range(8))
    assert torch.equal(data["responses"], rows(indices, "responses"))


def test_reset_cancels_a_waiting_get_so_it_cannot_take_the_next_iteration(fresh, worker):
    # A consumer whose iteration is abandoned (e.g. its producer died) must not steal the next one's samples.
    waiting = worker.get.remote(fresh, "reward", 4)
    deadline = time.monotonic() + 60
    while fresh.stats()["controllers"]["reward"]["waiting_gets"] == 0:  # the get has reached the dock
        assert time.monotonic() < deadline, "the get never reached the dock"
        time.sleep(0.05)
    fresh.reset()
    with pytest.raises(DockCancelled, match="'reward' was cancelled: the dock was reset"):
        ray.get(waiting, timeout=30)
    put(fresh, range(4), ["responses"])
    assert fresh.get(DockRequest("reward", 4)).indices == [0, 1, 2, 3]


def test_windows_isolate_iterations_that_share_the_dock(fresh, worker):
    # Two iterations in flight (max_staleness 1): each owns half of the dock; starting one over must not touch
    # the other's samples or cancel the get waiting on them.
    half = CAPACITY // 2
    put(fresh, range(4), ["responses"])
    waiting = worker.get.remote(fresh, "reward", 4, window=(half, CAPACITY))
    deadline = time.monotonic() + 60
    while fresh.stats()["controllers"]["reward"]["waiting_gets"] == 0:
        assert time.monotonic() < deadline, "the get never reached the dock"
        time.sleep(0.05)
    assert not ray.wait([waiting], timeout=0.3)[0]  # the ready samples lie in the other window
    fresh.reset(window=(0, half))
    put(fresh, range(half, half + 4), ["responses"])
    indices, _ = ray.get(waiting, timeout=30)
    assert indices == list(range(half, half + 4))
    with pytest.raises(DockTimeout):
        fresh.get(DockRequest("reward", 4, window=(0, half), timeout_s=0.3))  # dropped by the windowed reset
    with pytest.raises(DockInvalid, match="kept indices must lie in the window"):
        fresh.reset(keep=[half], window=(0, half))
    with pytest.raises(DockInvalid, match="multiples of group_size"):
        fresh.get(DockRequest("reward", 1, window=(1, half)))


def test_dp_ranks_get_length_balanced_shares_from_metadata(fresh, worker):
    # Two DP ranks in two processes ask for their shares of one 8-sample mini-batch; rank 1 waits first.
    lengths = [40, 1, 35, 2, 30, 3, 25, 4]
    waiting = worker.get.remote(fresh, "reward", 4, dp_share=(1, 2))
    put(fresh, range(8), ["responses"], meta={"response_length": lengths})
    share0 = fresh.get(DockRequest("reward", 4, dp_share=(0, 2)))
    indices1, data1 = ray.get(waiting, timeout=60)
    assert sorted(share0.indices + indices1) == list(range(8))
    assert share0.meta["response_length"].tolist() == [lengths[i] for i in share0.indices]
    assert torch.equal(data1["responses"], rows(indices1, "responses"))
    totals = sorted(sum(lengths[i] for i in share) for share in (share0.indices, indices1))
    assert totals[1] - totals[0] <= 5  # index order: 106 vs 34
    with pytest.raises(DockInvalid, match="dp_share"):
        fresh.get(DockRequest("reward", 4, dp_share=(2, 2)))


def test_whole_groups(fresh):
    put(fresh, [0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11], ["responses"])
    assert fresh.get(DockRequest("reward", 8, whole_groups=True)).indices == list(range(4, 12))
    with pytest.raises(DockInvalid, match="multiple of group_size"):
        fresh.get(DockRequest("reward", 6, whole_groups=True))
    with pytest.raises(DockTimeout):
        fresh.get(DockRequest("reward", 4, whole_groups=True, timeout_s=0.3))


def test_timeout_names_consumer_columns_and_readiness(fresh):
    put(fresh, range(6), ["prompts", "responses", "logp"])
    put(fresh, range(2), ["rewards"])
    t0 = time.monotonic()
    with pytest.raises(DockTimeout) as err:
        fresh.get(DockRequest("update", 4, timeout_s=0.5))
    assert time.monotonic() - t0 < 10
    message = str(err.value)
    assert "'update'" in message and "only 2 samples" in message and "rewards (missing for 30)" in message


def test_impossible_get_fails_instead_of_hanging(fresh):
    put(fresh, range(CAPACITY), ["responses"])
    fresh.get(DockRequest("reward", 30))
    with pytest.raises(DockInvalid, match="never arrive"):
        fresh.get(DockRequest("reward", 3))
    with pytest.raises(DockInvalid, match="not registered"):
        fresh.get(DockRequest("nobody", 1))


def test_bad_puts_are_rejected(fresh):
    put(fresh, [0], ["responses"])
    with pytest.raises(DockInvalid, match="per-sample shape"):  # checked by the owning warehouse
        fresh.put([4], TensorDict({"responses": torch.zeros(1, SL + 1, dtype=torch.long)}, batch_size=[1]))
    with pytest.raises(DockInvalid, match="per-sample shape"):
        fresh.put([1], TensorDict({"responses": torch.zeros(1, SL + 1, dtype=torch.long)}, batch_size=[1]))
    with pytest.raises(DockInvalid, match="dtype"):
        fresh.put([1], TensorDict({"rewards": torch.zeros(1, dtype=torch.float64)}, batch_size=[1]))
    with pytest.raises(DockInvalid, match="out of range"):
        put(fresh, [CAPACITY], ["rewards"])
    with pytest.raises(DockInvalid, match="unknown column"):
        fresh.put([1], TensorDict({"values": torch.zeros(1)}, batch_size=[1]))
    assert fresh.get(DockRequest("reward", 1)).indices == [0]


def test_reset_keeps_only_what_is_asked(fresh):
    put(fresh, range(8), ["responses"], meta={"response_length": list(range(8))})
    fresh.get(DockRequest("reward", 8))
    fresh.reset(keep=[5, 6])
    batch = fresh.get(DockRequest("reward", 2, timeout_s=5))
    assert batch.indices == [5, 6]
    assert_rows(batch, ["responses"])
    assert batch.meta["age"].tolist() == [1, 1] and batch.meta["response_length"].tolist() == [5, 6]
    with pytest.raises(DockTimeout):
        fresh.get(DockRequest("reward", 1, timeout_s=0.3))


def test_stats_count_puts_gets_and_bytes(fresh):
    before = fresh.stats()
    put(fresh, range(8), ["responses"])
    fresh.get(DockRequest("reward", 8))
    after = fresh.stats()
    assert after["gets"] == before["gets"] + 1
    assert after["controllers"]["reward"]["consumed"] == 8
    assert after["busiest_bytes"] >= before["busiest_bytes"] + 8 * SL * 8 * 2 // 3


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux only")
def test_the_docks_processes_run_in_the_background(dock):
    """The dock's node processes and the central buffer wake up without preempting a model worker's threads
    (dockflow/background.py): every thread of each process is under SCHED_BATCH."""
    stats = dock.stats()
    processes = stats["warehouses"] + list(stats["controllers"].values()) if "warehouses" in stats else [stats["buffer"]]
    for pid in {p["pid"] for p in processes}:
        policies = {os.sched_getscheduler(int(t)) for t in os.listdir(f"/proc/{pid}/task")}
        assert policies == {os.SCHED_BATCH}, pid


def test_dock_names_must_be_unique(dock):
    with pytest.raises(DockInvalid, match="already exists"):
        create_dock(dock.spec)


op = st.one_of(
    st.tuples(st.just("put"), st.lists(st.integers(0, CAPACITY - 1), min_size=1, max_size=8, unique=True),
              st.sampled_from([["responses"], ["prompts", "logp"], ["rewards"]])),
    st.tuples(st.just("get"), st.sampled_from(list(CONSUMERS)), st.integers(1, 6)),
)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(op, max_size=14))
def test_random_interleavings_never_lose_duplicate_or_mix_up(dock, ops):
    dock.reset()
    written = {c: set() for c in COLUMNS}
    seen = {c: [] for c in CONSUMERS}
    for kind, *args in ops:
        if kind == "put":
            indices, columns = args
            put(dock, indices, columns)
            for c in columns:
                written[c].update(indices)
            continue
        consumer, size = args
        ready = set.intersection(*(written[c] for c in CONSUMERS[consumer])) - set(seen[consumer])
        if len(ready) < size:
            continue  # would block: covered by the timeout tests
        batch = dock.get(DockRequest(consumer, size, timeout_s=10))
        assert batch.indices == sorted(ready)[:size]
        assert_rows(batch, CONSUMERS[consumer])
        seen[consumer].extend(batch.indices)
    for consumer in CONSUMERS:
        assert len(seen[consumer]) == len(set(seen[consumer]))


def _until_dead(actor, timeout_s: float = 30.0) -> None:
    """Wait until ``actor``'s process is gone (its calls fail), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError(f"the killed dock process was still answering after {timeout_s:g} s")


def test_a_dead_dock_process_is_reported_not_waited_on(ray_local):
    """One node: its warehouses and controllers share one dock process; when it dies, puts and gets say so at
    once (a warehouse dying on another node while a get waits: ``test_dock_multinode.py``)."""
    dock = create_dock(DockSpec(columns={"x": torch.float32}, capacity=8, group_size=1, num_warehouses=2,
                                name="fragile", get_timeout_s=60))
    try:
        dock.register_consumer("c", ["x"])
        dock.put([0], TensorDict({"x": torch.ones(1)}, batch_size=[1]))
        assert dock.stats()["dock_processes"] == 1
        ray.kill(dock.shard_hosts[1])
        _until_dead(dock.shard_hosts[1])  # ray.kill only asks; a put sent before the process ends still lands
        with pytest.raises(DockUnavailable, match="dead|unavailable"):
            dock.put([1], TensorDict({"x": torch.ones(1)}, batch_size=[1]))  # owned by warehouse 1
        t0 = time.monotonic()
        with pytest.raises(DockUnavailable, match="get by consumer 'c'"):
            dock.get(DockRequest("c", 2))
        assert time.monotonic() - t0 < 30
    finally:
        dock.shutdown()


def test_unplaceable_dock_fails_fast(ray_local):
    t0 = time.monotonic()
    with pytest.raises(DockUnavailable, match="not alive"):
        create_dock(DockSpec(columns={"x": torch.float32}, capacity=8, warehouse_nodes=["ab" * 28], name="nowhere"))
    assert time.monotonic() - t0 < 10
    assert not [a for a in ray.util.list_named_actors() if a.startswith("nowhere/")]
