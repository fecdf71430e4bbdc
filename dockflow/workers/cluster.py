"""Connect to a Ray cluster, or start the embedded local one (auth disabled, no dashboard)."""

from __future__ import annotations

import os

from dockflow.config import Config, RayConfig


class ClusterError(RuntimeError):
    """Ray could not be started or reached; the message says which address and what to do."""


def run_namespace(cfg: Config) -> str:
    """The Ray namespace of a run's actors: ``ray.namespace``, or one named after the run."""
    return cfg.ray.namespace or f"dockflow-{cfg.run.name}"


def connect(cfg: RayConfig, namespace: str) -> bool:
    """``ray.init`` for this run: join ``cfg.address`` when set, else start a local cluster.

    Returns False when this process was already connected (the caller then must not shut Ray down)."""
    # Ray 2.60 turns token auth on by default; the embedded local cluster runs without it.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict = {"namespace": namespace, "log_to_driver": True, "include_dashboard": False}
    if cfg.address:
        kwargs.pop("include_dashboard")
        try:
            ray.init(address=cfg.address, **kwargs)
        except Exception as exc:  # noqa: BLE001 - Ray raises several types for an unreachable head
            raise ClusterError(
                f"cannot reach the Ray cluster at ray.address={cfg.address!r}: {exc}. "
                "Check the address (ray://host:10001 or host:6379), or set ray.address: null to start a local one."
            ) from None
        return True
    # address="local": always a fresh cluster of our own, never one that happens to run on this machine.
    ray.init(address="local", num_cpus=cfg.num_cpus, **kwargs)
    return True


def disconnect() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
