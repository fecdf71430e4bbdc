"""Chaos: the actor worker's process is killed (SIGKILL) during an iteration.

With ``fault_tolerance.restart`` the run restarts its workers from the last committed checkpoint, runs the
lost iterations again and finishes; the iterations between that checkpoint and the kill are not counted
twice. Without it the run fails with a message that names the stage and says the worker died.
"""

import os
import signal
import threading

import pytest
import ray

from dockflow.flow.trainer import train
from dockflow.flow.waiting import StageError

pytestmark = pytest.mark.slow


def kill_actor_soon(run_name: str) -> int:
    """SIGKILL the run's actor worker process 50 ms from now (the next iteration is then under way)."""
    actor = ray.get_actor(f"{run_name}-actor")
    pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
    threading.Timer(0.05, os.kill, (pid, signal.SIGKILL)).start()
    return pid


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="test-chaos")
    yield
    ray.shutdown()


def test_killed_actor_restarts_from_checkpoint_and_finishes(ray_cluster, tiny_config):
    cfg = tiny_config("chaos", 4, fault_tolerance__restart=True, dock__backend="centralized")
    killed: list[int] = []

    def chaos(step: int, metrics: dict) -> None:
        if step == 3 and not killed:  # checkpoints are at 2 and 4: iteration 3 is lost with the actor
            killed.append(kill_actor_soon(cfg.run.name))

    summary = train(cfg, on_iteration=chaos)
    assert killed, "the chaos hook never ran"
    assert summary["iterations"] == 4 and summary["restarts"] == 1
    assert summary["samples_trained"] == 4 * cfg.train_batch, "an iteration was counted twice or lost"
    assert len(summary["reward_per_iteration"]) == 4


def test_killed_actor_without_restart_fails_with_a_clear_error(ray_cluster, tiny_config):
    cfg = tiny_config("chaos_fail", 3, dock__backend="centralized")
    with pytest.raises(StageError, match="the worker running stage '.*' died"):
        train(cfg, on_iteration=lambda step, m: kill_actor_soon(cfg.run.name) if step == 1 else None)
