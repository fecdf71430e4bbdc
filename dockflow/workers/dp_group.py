"""The actor's data-parallel process group: W actor workers join one torch.distributed group (gloo on CPU); with
``train.engine: megatron`` the actor's DP x TP x PP ranks join one, and the critic's ranks another of their own.

Rank 0 starts the rendezvous store on a free port of its node and publishes ``host:port`` in Ray's key-value
store under a key unique to this set of workers (a restarted set gets a new one); the other ranks wait for it,
bounded, and connect. Every wait has a timeout and its error names what it waited for.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch.distributed as dist

KV_NAMESPACE = "dockflow-dp"
RANKS_OF = {"actor": "train.dp x train.tp x train.pp", "critic": "train.tp x train.pp"}  # what sets each group's size


class DPGroupError(RuntimeError):
    """The actor ranks could not form their process group in time."""


def _kv():
    from ray.experimental import internal_kv

    return internal_kv


def join_dp_group(rank: int, world: int, key: str, timeout_s: float, collective_timeout_s: float,
                  backend: str = "gloo", *, role: str = "actor") -> None:
    """Make this process rank ``rank`` of a ``world``-rank default process group of ``role``'s workers (actor or
    critic). ``timeout_s`` bounds the rendezvous, ``collective_timeout_s`` every later collective."""
    import ray

    if dist.is_initialized():
        raise DPGroupError(f"{role} rank {rank}: torch.distributed is already initialised in this process")
    wait = timedelta(seconds=timeout_s)
    if rank == 0:
        host = ray.util.get_node_ip_address()
        store = dist.TCPStore(host, 0, world, is_master=True, timeout=wait, wait_for_workers=False)
        _kv()._internal_kv_put(key, f"{host}:{store.port}", namespace=KV_NAMESPACE)
    else:
        host, port = _wait_for_address(key, rank, timeout_s, role).rsplit(":", 1)
        store = dist.TCPStore(host, int(port), world, is_master=False, timeout=wait)
    try:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=collective_timeout_s))
        dist.barrier()  # every rank is in: the address is no longer needed
    except Exception as exc:  # noqa: BLE001 - name what the rank waited for
        raise DPGroupError(
            f"{role} rank {rank} of {world} could not form its process group within ray.init_timeout_s="
            f"{timeout_s:.0f}s ({exc}); are all {world} {role} workers ({RANKS_OF[role]}) placed?"
        ) from exc
    if rank == 0:
        _kv()._internal_kv_del(key, namespace=KV_NAMESPACE)


def _wait_for_address(key: str, rank: int, timeout_s: float, role: str = "actor") -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = _kv()._internal_kv_get(key, namespace=KV_NAMESPACE)
        if value:
            return value.decode()
        time.sleep(0.1)
    raise DPGroupError(
        f"{role} rank {rank} waited ray.init_timeout_s={timeout_s:.0f}s for {role} rank 0 to publish the address "
        f"of its process group (Ray KV key {key!r}); rank 0 did not start or failed first"
    )
