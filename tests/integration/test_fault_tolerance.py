"""Chaos: the actor worker's process is killed (SIGKILL) during an iteration.

With ``fault_tolerance.restart`` the run restarts its workers from the last committed checkpoint, runs the
lost iterations again and finishes; the iterations between that checkpoint and the kill are not counted
twice. Without it the run fails with a message that names the stage and says the worker died.
"""

import os
import signal

import pytest
import ray

from dockflow.flow.trainer import train
from dockflow.flow.waiting import StageError
from dockflow.workers.resources import build_plan

pytestmark = pytest.mark.slow


class Chaos:
    """``on_iteration`` hook: SIGKILL the run's actor worker when iteration ``at`` closes. The stage loops have
    sent the next iteration's calls by then (they launch before they close), so the actor dies under way. Its
    pid is asked one iteration earlier: a call queued behind the next iteration's would come too late."""

    def __init__(self, run_name: str, at: int) -> None:
        self.run_name, self.at = run_name, at
        self.pid: int | None = None
        self.killed: list[int] = []

    def __call__(self, step: int, metrics: dict) -> None:
        if step == self.at - 1 or (step == self.at and self.pid is None):
            actor = ray.get_actor(f"{self.run_name}-actor")
            self.pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
        if step == self.at and not self.killed:
            os.kill(self.pid, signal.SIGKILL)
            self.killed.append(self.pid)


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="test-chaos")
    yield
    ray.shutdown()


def test_killed_actor_restarts_from_checkpoint_and_finishes(ray_cluster, tiny_config):
    cfg = tiny_config("chaos", 4, fault_tolerance__restart=True, dock__backend="centralized")
    chaos = Chaos(cfg.run.name, at=3)  # checkpoints are at 2 and 4: iteration 4 is lost with the actor
    summary = train(cfg, on_iteration=chaos)
    assert chaos.killed, "the chaos hook never ran"
    assert summary["iterations"] == 4 and summary["restarts"] == 1
    assert summary["samples_trained"] == 4 * build_plan(cfg).train_batch, "an iteration was counted twice or lost"
    assert len(summary["reward_per_iteration"]) == 4


def test_killed_actor_without_restart_fails_with_a_clear_error(ray_cluster, tiny_config):
    cfg = tiny_config("chaos_fail", 3, dock__backend="centralized")
    with pytest.raises(StageError, match="the worker running stage '.*' died"):
        train(cfg, on_iteration=Chaos(cfg.run.name, at=1))
