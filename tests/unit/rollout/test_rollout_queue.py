"""The rollout queue: fixed chunks without partial rollout; with it, exactly G finished groups per iteration,
parked groups resumed first, at most max_age parks, and never older than the bound when trained."""

import random

import pytest

from dockflow.config import load_config
from dockflow.rollout.queue import (
    FinishedWork,
    Grant,
    ParkedGroup,
    QueueClient,
    QueueSettings,
    RolloutQueue,
    RolloutQueueTimeout,
    queue_settings,
)
from dockflow.workers.resources import build_plan


def test_fixed_chunks_map_to_fixed_slots_whoever_takes_them():
    q = RolloutQueue(QueueSettings(chunk_groups=3))
    q.open(0, list(range(10, 18)))
    works = [q.take(0, rank=k % 2) for k in range(3)]
    assert [(w.prompt_ids, w.slot) for w in works] == [([10, 11, 12], 0), ([13, 14, 15], 3), ([16, 17], 6)]
    assert q.take(0) is None and q.stats(0)["taken_by"] == {0: 2, 1: 1}


def _finish(q: RolloutQueue, it: int, w, version: int, finishes) -> tuple[int, int, list[ParkedGroup]]:
    """Play a generator's part for work item ``w``: each group finishes if ``finishes(group)`` (always without a
    budget); report to the queue, park the overflow. Returns (slot, granted, the finished groups)."""
    groups = w.parked or [ParkedGroup(p, None, version, 0, it, open_rows=8) for p in w.prompt_ids]
    done = [p for p in groups if w.budget is None or p.open_rows == 0 or finishes(p)]
    parked = [ParkedGroup(p.prompt_id, None, min(p.version, version), p.age + 1, it, open_rows=p.open_rows)
              for p in groups if p not in done]
    slot, granted = q.finish(FinishedWork(it, len(groups), len(done), parked, budget=w.budget is not None, new=not w.parked))
    q.park([ParkedGroup(p.prompt_id, None, min(p.version, version), p.age, it, open_rows=0) for p in done[granted:]])
    return slot, granted, done


def test_partial_rollout_fills_each_window_with_exactly_g_finished_groups():
    g, max_age, staleness = 6, 2, 1
    for seed in range(50):
        rng = random.Random(seed)
        q = RolloutQueue(QueueSettings(
            chunk_groups=rng.randint(1, 4), token_budget=2, max_age=max_age, age_bound=staleness + max_age,
            over_provision=rng.choice([0.0, 0.5, 1.0]), next_prompts=lambda i: [100 * i + k for k in range(g)]))
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
                    for p in work.parked:
                        assert p.age <= max_age and (p.open_rows == 0 or work.budget is None) == (
                            p.open_rows == 0 or p.age >= max_age or p.parked_in == it)
                        assert it - min(p.version, version) <= staleness + max_age
                        assert p.parked_in <= it
                if work is None or rng.random() < 0.5:  # finish some work item, in any order
                    w = in_flight.pop(rng.randrange(len(in_flight)))
                    slot, granted, _ = _finish(q, it, w, version, lambda p, rng=rng: rng.random() < 0.5)
                    slots.extend(range(slot, slot + granted))
            assert sorted(slots) == list(range(g)), (seed, it, slots)


def test_over_provisioned_stream_finishes_last_iterations_groups_and_starts_g_new_ones():
    """One generator, groups finishing within the budget with probability 0.1: after the first iteration (which
    over-provisions to prime the pool) each iteration finishes what the previous one parked and starts G new
    prompts; no new prompt is generated twice and nothing is dropped."""
    g, chunk = 16, 4
    rng = random.Random(0)
    ids = lambda i: [1000 * i + k for k in range(g)]  # noqa: E731
    q = RolloutQueue(QueueSettings(chunk, token_budget=8, max_age=1, age_bound=2, over_provision=1.0, next_prompts=ids))
    started: list[int] = []
    for it in range(12):
        q.open(it, ids(it))
        finished_from = {"parked": 0, "new": 0}
        while (work := q.take(it)) is not None:
            started.extend(work.prompt_ids)
            _, _, done = _finish(q, it, work, it, lambda p: rng.random() < 0.1)
            finished_from["parked" if work.parked else "new"] += len(done)
        stats = q.stats(it)
        assert stats["finished"] == g
        if it == 0:
            assert g < stats["started"] <= 2 * g  # over-provisioned: what parks primes iteration 1
        else:
            assert stats["started"] == g and finished_from["parked"] >= g // 2, (it, stats, finished_from)
    assert len(started) == len(set(started)) and q.dropped == 0


def test_a_silent_queue_actor_is_reported_not_waited_on(monkeypatch):
    import ray

    class Remote:
        _method_name = "take"  # as on Ray's ActorMethod

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
        QueueClient(QueueHandle(), timeout_s=5.0).take(3, 0)
    assert waited["timeout"] == 5.0


def test_when_most_groups_finish_within_the_budget_no_prompt_is_started_for_a_full_window():
    """Short responses (90% of groups finish within the budget): once the window is full no more new prompts are
    started, and a short window starts only about as many as it misses, so few finished groups wait for the next
    window."""
    g, chunk = 16, 16  # one work item holds the iteration's G prompts, as with rollout.batch_size = G x N
    rng = random.Random(1)
    ids = lambda i: [1000 * i + k for k in range(g)]  # noqa: E731
    q = RolloutQueue(QueueSettings(chunk, token_budget=8, max_age=1, age_bound=2, over_provision=1.0, next_prompts=ids))
    for it in range(12):
        q.open(it, ids(it))
        while (work := q.take(it)) is not None:
            _finish(q, it, work, it, lambda p: rng.random() < 0.9)
        assert q.stats(it)["finished"] == g
        assert q.stats(it)["started"] <= g + 4, (it, q.stats(it))  # the window's G, and a few to make up the shortfall
    assert q.overflow <= 12, q.overflow


@pytest.mark.parametrize("on_stale", ["drop", "regenerate"])
def test_a_parked_group_past_the_bound_is_dropped_or_its_prompt_starts_over(on_stale):
    q = RolloutQueue(QueueSettings(2, token_budget=4, max_age=3, age_bound=1, next_prompts=lambda i: [], on_stale=on_stale))
    q.open(0, [10, 11])
    work = q.take(0)
    old, fresh = (ParkedGroup(p, None, 0, 1, 0, open_rows=2) for p in work.prompt_ids)
    assert q.finish(FinishedWork(0, 2, 0, [old, fresh], budget=True)) == Grant(slot=0, granted=0)
    q.iterations[0].finished = 2  # iteration 0's window was filled by others
    fresh.version = 1
    q.open(2, [20, 21])  # iteration 2 trains on version 2 at the earliest: version 0 is 2 > 1 versions old
    work = q.take(2)
    assert work.parked == [fresh]
    stats = q.stats(2)
    if on_stale == "drop":
        assert (stats["dropped"], stats["regenerated"], list(q.stream)) == (1, 0, [20, 21])
    else:
        assert (stats["dropped"], stats["regenerated"], list(q.stream)) == (0, 1, [10, 20, 21])
    with pytest.raises(ValueError, match="on_stale='keep'"):
        QueueSettings(1, token_budget=4, on_stale="keep")


class _Actor:
    """A Ray actor handle over a local queue: ``handle.method.remote(*args)`` returns the call's result as its ref."""

    def __init__(self, queue: RolloutQueue) -> None:
        self._queue = queue

    def __getattr__(self, name: str):
        method = getattr(self._queue, name)
        return type("ActorMethod", (), {"remote": staticmethod(lambda *args: ("ref", method(*args)))})()


def test_the_queue_client_calls_a_local_queue_and_an_actor_alike(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref[1])
    answers = []
    for queue in (RolloutQueue(QueueSettings(2)), _Actor(RolloutQueue(QueueSettings(2)))):
        client = QueueClient(queue, timeout_s=5.0)
        (queue._queue if isinstance(queue, _Actor) else queue).open(4, [7, 8, 9])
        work = client.take(4, 1)
        grant = client.finish(FinishedWork(4, len(work.prompt_ids), 2))
        client.park([ParkedGroup(7, None, 0, 0, 4, open_rows=0)])
        state = client.state_dict()
        client.load_state_dict(state)
        answers.append((work.prompt_ids, grant, client.stats(4)["taken_by"], client.stats(4)["overflow"]))
    assert answers[0] == answers[1] == ([7, 8], Grant(0, 2), {1: 1}, 1)


def test_the_settings_of_a_partial_rollout_config():
    cfg = load_config("configs/grpo_arith_async.yaml", ["rollout.partial.token_budget=16", "rollout.partial.max_age=2",
                                                        "train.max_staleness=1", "rollout.partial.on_stale=regenerate"])
    s = queue_settings(cfg, build_plan(cfg))
    assert (s.chunk_groups, s.token_budget, s.max_age, s.age_bound, s.rows_per_chunk, s.on_stale) == (
        max(1, cfg.rollout.batch_size // cfg.rollout.group_size), 16, 2, 3, cfg.rollout.batch_size, "regenerate")
    assert s.next_prompts(1) == RolloutQueue(s).next_prompts(1) and len(s.next_prompts(1)) == cfg.rollout.prompts_per_iter
    plain_cfg = load_config("configs/grpo_arith_async.yaml", ["rollout.partial.token_budget=null"])
    plain = queue_settings(plain_cfg, build_plan(plain_cfg))
    assert plain.token_budget is None and plain.next_prompts is None
