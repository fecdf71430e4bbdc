"""The rollout queue: fixed chunks without partial rollout; with it, exactly G finished groups per iteration,
parked groups resumed first, at most max_age parks, and never older than the bound when trained."""

import random

import pytest

from dockflow.workers.rollout_queue import ParkedGroup, RolloutQueue


def test_fixed_chunks_map_to_fixed_slots_whoever_takes_them():
    q = RolloutQueue(chunk_groups=3)
    q.open(0, list(range(10, 18)))
    works = [q.take(0, rank=k % 2) for k in range(3)]
    assert [(w.prompt_ids, w.slot) for w in works] == [([10, 11, 12], 0), ([13, 14, 15], 3), ([16, 17], 6)]
    assert q.take(0) is None and q.stats(0)["taken_by"] == {0: 2, 1: 1}


def test_partial_rollout_fills_each_window_with_exactly_g_finished_groups():
    g, max_age, staleness = 6, 2, 1
    for seed in range(50):
        rng = random.Random(seed)
        q = RolloutQueue(chunk_groups=rng.randint(1, 4), token_budget=2, max_age=max_age, age_bound=staleness + max_age)
        for it in range(8):
            version = max(0, it - rng.randint(0, staleness))  # the generator's weights: within max_staleness
            q.open(it, [100 * it + k for k in range(g)])
            slots: list[int] = []
            in_flight = []
            while True:
                work = q.take(it)
                if work is None:
                    if not in_flight:
                        break
                else:
                    in_flight.append(work)
                if work is None or rng.random() < 0.5:  # finish some work item, in any order
                    w = in_flight.pop(rng.randrange(len(in_flight)))
                    groups = w.parked or [ParkedGroup(p, None, version, 0, it) for p in w.prompt_ids]
                    done = [p for p in groups if w.budget is None or rng.random() < 0.5]
                    for p in groups:
                        assert p.age <= max_age
                        assert it - min(p.version, version) <= staleness + max_age
                    parked = [ParkedGroup(p.prompt_id, None, min(p.version, version), p.age + 1, it)
                              for p in groups if p not in done]
                    assert w.parked == [] or all(p.parked_in < it for p in w.parked)  # resumed in a later iteration
                    first = q.finish(it, len(groups), len(done), parked)
                    slots.extend(range(first, first + len(done)))
            assert sorted(slots) == list(range(g)), (seed, it, slots)


def test_a_silent_queue_actor_is_reported_not_waited_on(monkeypatch):
    import ray

    from dockflow.workers.rollout import RolloutQueueTimeout, call

    class Remote:
        def remote(self, *args):
            return "ref"

    class QueueHandle:
        take = Remote()

    waited = {}

    def get(ref, timeout=None):
        waited["timeout"] = timeout
        raise ray.exceptions.GetTimeoutError("no answer")

    monkeypatch.setattr(ray, "get", get)
    with pytest.raises(RolloutQueueTimeout, match="'take' for iteration 3 within 5s"):
        call(QueueHandle(), "take", 3, 0, timeout_s=5.0)
    assert waited["timeout"] == 5.0
