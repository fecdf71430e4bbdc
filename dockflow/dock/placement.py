"""Where the dock's actors go: alive Ray nodes, hard node affinity, and fail-fast readiness checks.

Dock actors ask for no CPUs (they would hold them for the dock's whole life); a hard node-affinity
strategy pins each one, and a bounded wait on a ``ready`` call turns "cannot be placed" into an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from dockflow.dock.errors import DockInvalid, DockUnavailable

HEAD_RESOURCE = "node:__internal_head__"


def alive_nodes() -> list[str]:
    """Ids of alive nodes: the head node first, the others by id (stable for a given cluster)."""
    nodes = [n for n in ray.nodes() if n["Alive"]]
    nodes.sort(key=lambda n: (HEAD_RESOURCE not in n["Resources"], n["NodeID"]))
    return [n["NodeID"] for n in nodes]


def current_node() -> str:
    return ray.get_runtime_context().get_node_id()


def require_alive(node_ids: list[str], what: str) -> None:
    alive = set(alive_nodes())
    dead = [n for n in node_ids if n not in alive]
    if dead:
        raise DockUnavailable(
            f"cannot place {what}: node(s) {dead} are not alive Ray nodes; alive nodes are {sorted(alive)}"
        )


def pinned(node_id: str, name: str, namespace: str | None, detached: bool = False) -> dict[str, Any]:
    """Actor options: no CPUs, hard affinity to ``node_id``, a name, no restarts, many concurrent calls;
    ``detached``: the actor outlives the process that created it."""
    return {
        "lifetime": "detached" if detached else None,
        "num_cpus": 0,
        "name": name,
        "namespace": namespace,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        "max_restarts": 0,
        "max_concurrency": 1000,
    }


def wait_ready(ready_refs: Mapping[str, ray.ObjectRef], timeout_s: float) -> list[Any]:
    """Wait (at most ``timeout_s``) until every named actor answered its ``ready`` call."""
    names = list(ready_refs)
    refs = [ready_refs[n] for n in names]
    done, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if pending:
        late = [names[refs.index(r)] for r in pending]
        raise DockUnavailable(
            f"dock actors {late} did not start within {timeout_s:.0f}s (waited for their ready call); "
            f"the cluster may lack the node or resources they are pinned to. "
            f"Available: {ray.available_resources()}"
        )
    try:
        return ray.get(refs)
    except ray.exceptions.RayActorError as err:
        raise DockUnavailable(f"a dock actor died while starting: {err}") from err


def refuse_existing(name: str, namespace: str | None) -> None:
    """Fail if a named dock actor already exists (two docks must not share actors by accident)."""
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return
    raise DockInvalid(f"a dock actor named {name!r} already exists; shut that dock down or pick another name")
