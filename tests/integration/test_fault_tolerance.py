"""Chaos with the default distributed dock: the processes of a run are killed (SIGKILL) during iterations.

With ``fault_tolerance.restart`` the run restarts its workers and its dock from the last committed checkpoint
after each death, runs the lost iterations again and ends bit-identical to the uninterrupted run: the same
final weights and the same reward in every iteration. Out of ``fault_tolerance.max_restarts`` the run stops
with one line that says so.
"""

import re
import signal
from pathlib import Path

import psutil
import pytest
import ray
import torch
from safetensors.torch import load_file

from dockflow.flow.trainer import train
from dockflow.flow.waiting import StageError
from dockflow.workers.resources import build_plan

pytestmark = pytest.mark.slow

# victim -> the Ray actor class whose process dies, in the order they die: one per iteration, from iteration 1.
# (The actor dies in the max_restarts test below; its restore from a checkpoint is bit-identical in
# test_train_loop.py's resume.)
VICTIMS = {
    "generator": "GeneratorWorker",  # disaggregated placement: the generation worker
    "reference": "ReferenceWorker",  # algorithm.kl_coef > 0
    "reward": "RewardWorker",
    "dock": "DockNodeActor",  # the node's dock process: its warehouses and controllers
}
ACTOR = {"actor": "ActorWorker"}
# Every role the victims need, on 2 CPUs: the generator on no CPU of its own (as in test_train_loop.py); one
# checkpoint per iteration so that a death costs one iteration; the evaluation at the end only.
ROLES = {"placement__mode": "disaggregated", "placement__generator_cpus": 0, "algorithm__kl_coef": 0.05,
         "checkpoint__every": 1, "eval__every": 0}


def kill_actor_process(actor_class: str) -> int:
    """SIGKILL the process of this test's Ray cluster that runs an actor of ``actor_class`` (Ray titles an actor's
    process ``ray::Class`` or ``ray::Class.method``). Only this process's descendants are searched: other Ray
    clusters on the machine are left alone. Returns the pid."""
    title = f"ray::{actor_class}"
    for proc in psutil.Process().children(recursive=True):
        try:
            name = " ".join(proc.cmdline()).strip()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if name == title or name.startswith((f"{title}.", f"{title} ")):
            proc.send_signal(signal.SIGKILL)
            return proc.pid
    raise AssertionError(f"no process of a {actor_class} actor in this test's Ray cluster")


class Chaos:
    """``on_iteration`` hook: when iteration ``k`` closes, kill the k-th victim. The stage loops have sent the next
    iteration's calls by then (they launch before they close), so it dies under way; each victim dies once, in a
    later iteration than the restart before it went back to."""

    def __init__(self, victims: list[str]) -> None:
        self.at = {k + 1: v for k, v in enumerate(victims)}
        self.killed: dict[str, int] = {}

    def __call__(self, step: int, metrics: dict) -> None:
        victim = self.at.get(step)
        if victim is not None and victim not in self.killed:
            self.killed[victim] = kill_actor_process({**VICTIMS, **ACTOR}[victim])


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="test-chaos")
    yield
    ray.shutdown()


def weights(summary: dict) -> dict[str, torch.Tensor]:
    return load_file(str(Path(summary["final_model"]) / "model.safetensors"))


@pytest.mark.timeout(1200)
@pytest.mark.chaos  # 200 s: `make test-chaos`. In `make test`: a dead dock counts as a death (test_restart_limits.py),
# and a killed worker's restart ends bit-identical (test_outages.py: the actor killed inside a save)
def test_each_killed_process_restarts_the_run_bit_identically(ray_cluster, tiny_config):
    """Every victim dies in turn, one iteration each (the generator, the reference, the reward worker and the dock's
    node process); the run restarts once per victim and ends with the uninterrupted run's weights and rewards. Over
    30 s (more than the default 600 s timeout on a loaded machine): two runs, each restart starting every worker
    process again; one run for all victims saves a run start per victim."""
    victims = list(VICTIMS)
    iterations = len(victims) + 1
    uninterrupted = train(tiny_config("calm", iterations, **ROLES))
    cfg = tiny_config("chaos", iterations, fault_tolerance__restart=True, fault_tolerance__max_restarts=len(victims),
                      **ROLES)
    assert cfg.dock.backend == "distributed"
    chaos = Chaos(victims)
    summary = train(cfg, on_iteration=chaos)
    assert list(chaos.killed) == victims, f"killed only {chaos.killed}"
    assert summary["restarts"] == len(victims)
    assert summary["samples_trained"] == iterations * build_plan(cfg).train_batch, "an iteration was counted twice"
    assert summary["reward_per_iteration"] == uninterrupted["reward_per_iteration"]
    a, b = weights(uninterrupted), weights(summary)
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"the restarted run's final weights differ in {differ}"


def test_a_death_past_max_restarts_stops_the_run_with_one_line(ray_cluster, tiny_config):
    """The actor dies with no restart left (``max_restarts: 0``): one line says so, and what died."""
    cfg = tiny_config("chaos_out", 2, fault_tolerance__restart=True, fault_tolerance__max_restarts=0)
    chaos = Chaos(["actor"])
    with pytest.raises(StageError) as info:
        train(cfg, on_iteration=chaos)
    assert chaos.killed
    line = str(info.value)
    assert "\n" not in line
    assert re.match(r"fault_tolerance\.max_restarts=0 reached, the run stops: iteration \d: the worker running stage "
                    r"'\w+' died: .*class_name: ActorWorker .*rerun with --resume", line), line
