"""Starting the run plan's workers: the CPUs it asks for against the cluster (refused at once when they can never
fit), and the wait for every worker's ``ready`` that follows each one's progress.

    check_cluster_cpus(plan)              # WorkerStartError in one line, before any worker starts
    wait_ready(handles, StartLimits(placement_s=120, init_s=600), worker_cpus(plan), building)

A worker goes through two phases, each with its own budget: Ray places it (gives it its CPUs and devices:
``ray.init_timeout_s``, from submission), then it builds its model and engines (``ray.engine_init_timeout_s``,
from placement). Which phase a worker is in comes from Ray's actor table (GCS): a placed actor has a process
(``Pid``) while its constructor runs. Where the table cannot be read (a ``ray://`` client), a worker counts as
placed when submitted, and the message says that the phase was not known. Light, no torch: the pipeline's setup
task imports it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dockflow.algos.plan import RunPlan

PHASE_CHECK_S = 0.5  # how often the wait looks at the pending workers' phase


class WorkerStartError(RuntimeError):
    """Workers cannot be placed, did not come up in time, or died while starting."""


def worker_label(role: str, k: int) -> str:
    """The actor-name suffix of worker ``k`` of ``role`` (the plan's ``reward_model`` is ``reward-model``):
    generators are numbered from 0, other roles' first worker is unnumbered (``actor``, ``actor-1``, ...)."""
    base = role.replace("_", "-")
    return f"{base}-{k}" if k or role == "generator" else base


def worker_cpus(plan: RunPlan) -> dict[str, float]:
    """Worker label -> the Ray CPUs it asks for, for every worker of the plan."""
    return {worker_label(r.name, k): r.cpus for r in plan.roles.values() for k in range(r.count)}


def _cpus(n: float) -> str:
    return f"{n:g}" if n == round(n, 2) else f"{n:.2f}"


def cpu_fit_error(need: dict[str, float], total: float, node_cpus: list[float]) -> str | None:
    """Why workers asking for ``need`` (label -> CPUs) can never all be placed on a cluster of ``total`` CPUs
    whose nodes have ``node_cpus``, in one line; None when they may fit."""
    asked = sum(need.values())
    fix = ("lower ray.actor_cpus / ray.critic_cpus (each shared by the role's ranks) / ray.reference_cpus / "
           "placement.generator_cpus / reward.model_cpus, raise ray.num_cpus, or add nodes")
    shown = {k: round(v, 4) for k, v in need.items() if v}
    if asked > total + 1e-9:
        return (f"the run's workers ask Ray for {_cpus(asked)} CPUs in all ({shown}) but the cluster has "
                f"{_cpus(total)}: {fix}")
    largest = max(node_cpus, default=total)
    big = {k: v for k, v in need.items() if v > largest + 1e-9}
    if big:
        return (f"workers {sorted(big)} each ask Ray for more CPUs ({ {k: round(v, 4) for k, v in big.items()} }) than "
                f"the largest node has ({_cpus(largest)}): {fix}")
    return None


def check_cluster_cpus(plan: RunPlan) -> None:
    """The plan's CPUs against the connected cluster's (``cpu_fit_error``): refused here, before any worker
    starts, not after ``ray.init_timeout_s``."""
    import ray

    nodes = [float(n["Resources"].get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")]
    error = cpu_fit_error(worker_cpus(plan), float(ray.cluster_resources().get("CPU", 0.0)), nodes)
    if error:
        raise WorkerStartError(error)


def start_error(exc: BaseException) -> str:
    """A worker's start-up error as one line: the constructor's own exception (DockFlow's by its message, any other
    by type and message), not Ray's traceback of it."""
    import ray

    if isinstance(exc, ray.exceptions.RayTaskError) and exc.cause is not None:
        exc = exc.cause
    elif isinstance(exc, ray.exceptions.RayActorError) and exc.actor_init_failed:
        # the creation task's traceback: its last line is the exception ("module.Error: message")
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        head, _, message = (lines[-1] if lines else "").partition(": ")
        if message and " " not in head:
            return message if head.startswith("dockflow.") else f"{head.rsplit('.', 1)[-1]}: {message}"
    text = " ".join(str(exc).split())
    if type(exc).__module__.startswith("dockflow.") and text:  # ours are written to be read
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def placed(handles: dict[str, Any]) -> dict[str, bool | None]:
    """Label -> whether Ray has placed that actor (it has a process: its constructor runs or has run), from the
    GCS actor table; None where the table cannot be read."""
    try:
        from ray._private import state

        out: dict[str, bool | None] = {}
        for label, h in handles.items():
            info = state.actors(actor_id=h._actor_id.hex())
            out[label] = bool(info) and (info.get("State") == "ALIVE" or bool(info.get("Pid")))
        return out
    except Exception:  # noqa: BLE001 - a client connection or another Ray: the phase is unknown, not an error
        return dict.fromkeys(handles)


@dataclass(frozen=True)
class StartLimits:
    """The two budgets of a worker's start: being placed (from submission), then starting (from placement)."""

    placement_s: float  # ray.init_timeout_s
    init_s: float  # ray.engine_init_timeout_s


def _free_cpus() -> str:
    import ray

    return f"{_cpus(ray.available_resources().get('CPU', 0.0))} of {_cpus(ray.cluster_resources().get('CPU', 0.0))}"


def _late(phase: dict[str, bool | None], since: dict[str, float], now: float, limits: StartLimits) -> tuple[list, list]:
    """(labels past their placement budget, labels past their start budget)."""
    unplaced = [w for w, p in phase.items() if p is False and now - since[w] > limits.placement_s]
    starting = [w for w, p in phase.items() if p is not False and now - since[w] > limits.init_s]
    return unplaced, starting


def _timeout_error(unplaced: list[str], starting: list[str], need: dict[str, float], building: dict[str, str],
                   waited: dict[str, float], limits: StartLimits, known: bool) -> WorkerStartError:
    """The one line naming what the late workers waited for."""
    if unplaced:
        return WorkerStartError(
            f"workers {unplaced} were not placed within ray.init_timeout_s={limits.placement_s:g}s: they ask for "
            f"{ {w: round(need.get(w, 0.0), 4) for w in unplaced} } CPUs (and their devices, if any) and the cluster has "
            f"{_free_cpus()} CPUs free. Stop what holds them, lower ray.actor_cpus / ray.reference_cpus / ray.critic_cpus / "
            "placement.generator_cpus / reward.model_cpus, or add nodes")
    w = starting[0]
    holds = "holds its CPUs and" if known else "(Ray's actor table could not be read: it may still wait for CPUs)"
    return WorkerStartError(
        f"the {w} worker {holds} is still starting after {waited[w]:.0f}s, building {building.get(w, 'its state')}; "
        f"past ray.engine_init_timeout_s={limits.init_s:g}s (counted from its placement). On a loaded machine raise "
        f"ray.engine_init_timeout_s; else see the worker's log"
        + (f" (also still starting: {starting[1:]})" if len(starting) > 1 else ""))


def wait_ready(handles: dict[str, Any], limits: StartLimits, need: dict[str, float], building: dict[str, str]) -> None:
    """Wait for every worker's ``ready`` (label -> actor handle), each within ``limits``: first placed, then
    started; raise a WorkerStartError naming the late ones and what they waited for (CPUs, ``need``; or building
    ``building[label]``), or at once the first that failed to start (its error in one line, ``start_error``)."""
    import ray

    start = time.monotonic()
    refs = {label: h.ready.remote() for label, h in handles.items()}
    since = dict.fromkeys(refs, start)  # submission, then placement
    phase: dict[str, bool | None] = dict.fromkeys(refs, False)
    while refs:
        done, _ = ray.wait(list(refs.values()), num_returns=1, timeout=PHASE_CHECK_S)
        for label in [w for w, r in refs.items() if r in done]:
            try:
                ray.get(refs.pop(label))
            except Exception as exc:  # noqa: BLE001 - surface the worker's own error with its name
                raise WorkerStartError(f"the {label} worker failed to start: {start_error(exc)}") from None
            phase.pop(label)
        now = time.monotonic()
        looked = placed({w: handles[w] for w in refs})
        for w, p in looked.items():
            if phase[w] is False and p is not False:
                phase[w], since[w] = p, now if p else start  # unknown: counted from submission
        unplaced, starting = _late(phase, since, now, limits)
        if unplaced or starting:
            waited = {w: now - since[w] for w in refs}
            known = all(phase[w] is True for w in starting)
            raise _timeout_error(unplaced, starting, need, building, waited, limits, known)
