"""Starting the workers: the actor's (critic's) CPUs shared by its ranks, a plan the cluster can never hold refused
before any worker starts, and a wait that tells a worker waiting for CPUs from one that holds them and is still
building its engine (a local Ray cluster of 2 CPUs, actors that sleep in their constructor)."""

from __future__ import annotations

import sys
import time

import pytest
import ray

from dockflow.config import load_config
from dockflow.workers.resources import build_plan
from dockflow.workers.runtime import rank_threads
from dockflow.workers.startup import (
    StartLimits,
    WorkerStartError,
    check_cluster_cpus,
    cpu_fit_error,
    wait_ready,
    worker_cpus,
)

CONFIG = "configs/grpo_arith.yaml"


@pytest.mark.parametrize("overrides", [["train.engine=megatron", "train.tp=2"], ["train.dp=2"]], ids=["tp2", "dp2"])
def test_the_readmes_multi_rank_actors_share_the_actors_cpus_and_fit_two_cores(overrides: list[str]) -> None:
    cfg = load_config(CONFIG, overrides)
    need = worker_cpus(build_plan(cfg))
    assert need == {"actor": 1.0, "actor-1": 1.0, "reward": 0.0}  # ray.actor_cpus=2, shared by 2 ranks
    assert cpu_fit_error(need, total=2.0, node_cpus=[2.0]) is None
    assert rank_threads(cfg.ray.torch_threads, cfg.train.actor_ranks) == 1  # one thread on its one CPU
    assert rank_threads(cfg.ray.torch_threads, 1) == cfg.ray.torch_threads == 2


def test_the_critics_cpus_are_shared_by_its_ranks_too() -> None:
    cfg = load_config("configs/ppo_arith.yaml", ["train.engine=megatron", "train.tp=2", "ray.critic_cpus=1"])
    need = worker_cpus(build_plan(cfg))
    assert need["critic"] == need["critic-1"] == 0.5 and need["actor"] == need["actor-1"] == cfg.ray.actor_cpus / 2
    assert build_plan(cfg).model_cpus() == cfg.ray.actor_cpus + cfg.ray.critic_cpus


def test_a_plan_the_cluster_can_never_hold_is_refused_in_one_line() -> None:
    need = worker_cpus(build_plan(load_config(CONFIG, ["train.dp=2", "ray.actor_cpus=4"])))
    error = cpu_fit_error(need, total=2.0, node_cpus=[2.0])
    assert error is not None and "\n" not in error
    assert "ask Ray for 4 CPUs in all" in error and "the cluster has 2" in error and "ray.actor_cpus" in error
    error = cpu_fit_error({"actor": 3.0, "reward": 0.0}, total=4.0, node_cpus=[2.0, 2.0])  # fits the sum, no node
    assert error is not None and "['actor']" in error and "the largest node has (2)" in error
    assert cpu_fit_error({"actor": 2.0, "reference": 1.0}, total=3.0, node_cpus=[2.0, 1.0]) is None


class SlowStart:
    """A worker whose constructor takes ``seconds`` (an engine being built)."""

    def __init__(self, seconds: float) -> None:
        time.sleep(seconds)

    def ready(self) -> bool:
        return True


class BrokenStart:
    def __init__(self) -> None:
        raise ValueError("no engine here")

    def ready(self) -> bool:
        return True


@pytest.fixture(scope="module")
def two_cpus():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the classes above, in worker processes
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="startup-test", log_to_driver=False)
    yield
    ray.shutdown()


def _spawn(cls: type, cpus: float, *args: object) -> object:
    return ray.remote(cls).options(num_cpus=cpus, max_concurrency=1).remote(*args)


def test_a_placed_worker_still_building_its_engine_is_named_as_such_not_blamed_on_cpus(two_cpus) -> None:
    slow = _spawn(SlowStart, 1.0, 60.0)
    start = time.monotonic()
    with pytest.raises(WorkerStartError) as err:
        wait_ready({"actor": slow}, StartLimits(placement_s=60.0, init_s=2.0), {"actor": 1.0},
                   {"actor": "its vllm generation engine on cpu"})
    message = str(err.value)
    assert "the actor worker holds its CPUs and is still starting" in message, message
    assert "building its vllm generation engine on cpu" in message and "ray.engine_init_timeout_s=2s" in message
    assert "not placed" not in message and "free" not in message and "\n" not in message
    assert time.monotonic() - start < 45.0  # its own budget (from placement), not ray.init_timeout_s's 60 s
    ray.kill(slow)


def test_a_worker_the_cpus_are_held_from_waits_for_placement_and_says_so(two_cpus) -> None:
    hog = _spawn(SlowStart, 2.0, 0.0)
    wait_ready({"hog": hog}, StartLimits(placement_s=30.0, init_s=30.0), {"hog": 2.0}, {})
    starved = _spawn(SlowStart, 1.0, 0.0)
    with pytest.raises(WorkerStartError) as err:
        wait_ready({"actor": starved}, StartLimits(placement_s=1.0, init_s=30.0), {"actor": 1.0}, {"actor": "x"})
    message = str(err.value)
    assert "workers ['actor'] were not placed within ray.init_timeout_s=1s" in message, message
    assert "{'actor': 1.0} CPUs (and their devices, if any) and the cluster has 0 of 2 CPUs free" in message and "building" not in message
    ray.kill(hog)
    ray.kill(starved)


def test_a_slow_start_past_the_placement_budget_still_starts_and_a_broken_one_fails_at_once(two_cpus) -> None:
    # placed once its process is up (up to several seconds while the rest of the suite loads both cores), then
    # 10.5 s in its constructor: past placement_s from submission, well within init_s from placement
    slow = _spawn(SlowStart, 1.0, 10.5)
    wait_ready({"actor": slow}, StartLimits(placement_s=10.0, init_s=30.0), {"actor": 1.0}, {})
    assert ray.get(slow.ready.remote()) is True
    broken = _spawn(BrokenStart, 0.0)
    start = time.monotonic()
    with pytest.raises(WorkerStartError, match="^the reward worker failed to start: ValueError: no engine here$"):
        wait_ready({"reward": broken, "actor": slow}, StartLimits(placement_s=30.0, init_s=30.0), {}, {})
    assert time.monotonic() - start < 20.0  # at once, not at a budget's end
    with pytest.raises(WorkerStartError, match=r"ask Ray for 3 CPUs in all \(\{'actor': 3.0\}\) but the cluster has 2"):
        check_cluster_cpus(build_plan(load_config(CONFIG, ["ray.actor_cpus=3"])))
    ray.kill(slow)
