"""Run a light process (the dock's node processes, the reward worker) in the background of the model
workers: its wake-ups wait for a free core instead of preempting a torch thread.

Every Ray worker process wakes about 100 times a second even when idle (Ray's core worker checks for signals every
10 ms in its main thread; not configurable), and a run has a handful of light processes. On a machine whose cores
all run a model worker's OpenMP threads, each such wake-up preempts one of them and the others wait for it at
their next barrier. ``SCHED_BATCH`` keeps the process's fair share of CPU (its nice level is unchanged, so it is
never starved) but tells the kernel not to preempt a running thread when it wakes up: it runs at the next free
core or scheduler tick instead (docs/vs_trl.md, "The run's own processes").

``DOCKFLOW_BACKGROUND=0`` in the environment that starts the cluster turns it off (for A/B measurements).
"""

from __future__ import annotations

import os
import sys


def thread_ids() -> list[int]:
    """The kernel ids of this process's threads (Linux), or [] where /proc is not there."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{os.getpid()}/task")]
    except OSError:
        return []


def in_ray_actor() -> bool:
    """Whether this process hosts a Ray actor (not a driver, not a test that builds the class directly)."""
    if "ray" not in sys.modules:
        return False
    ray = sys.modules["ray"]
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def run_in_background() -> str:
    """In a Ray actor: ``background_policy()``. Elsewhere nothing changes (the caller's process is not ours to
    reschedule) and the answer is "normal". Call it only from a class that runs as its own actor: a class that a
    model worker also builds in-process (``RolloutQueue``) would put that model worker in the background."""
    if os.environ.get("DOCKFLOW_BACKGROUND", "1") == "0" or not in_ray_actor():
        return "normal"
    return background_policy()


def background_policy() -> str:
    """Put every thread of this process (and the threads it starts later) under ``SCHED_BATCH``, and keep torch,
    if this process imported it, to one thread. Returns the policy that is in force: "batch", or "normal"
    where the platform has no ``SCHED_BATCH`` (macOS) or refuses it; the process runs the same either way."""
    if "torch" in sys.modules:  # a light actor's torch calls are tiny: one thread, no OpenMP team to wake
        sys.modules["torch"].set_num_threads(1)
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return "normal"
    done = 0
    for tid in thread_ids():  # sched_setscheduler acts on one thread; new threads inherit their creator's policy
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
            done += 1
        except OSError:  # a thread that ended meanwhile, or a container that forbids it
            continue
    return "batch" if done else "normal"
