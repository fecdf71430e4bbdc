"""Connect to a Ray cluster, or start the embedded local one (auth disabled, no dashboard)."""

from __future__ import annotations

import os

from dockflow.algos.recipe import PreferenceSection
from dockflow.config import Config, RayConfig


class ClusterError(RuntimeError):
    """Ray could not be started or reached; the message says which address and what to do."""


def run_namespace(cfg: Config) -> str:
    """The Ray namespace of a run's actors: ``ray.namespace``, or one named after the run."""
    return cfg.ray.namespace or f"dockflow-{cfg.run.name}"


def connect(cfg: RayConfig, namespace: str, runtime_env: dict | None = None) -> bool:
    """``ray.init`` for this run: join ``cfg.address`` when set, else start a local cluster. ``runtime_env``: the
    job's (``run_runtime_env``: the user's reward modules, shipped to every worker).

    Returns False when this process was already connected (the caller then must not shut Ray down)."""
    # Ray 2.60 turns token auth on by default; the embedded local cluster runs without it.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict = {"namespace": namespace, "log_to_driver": True, "include_dashboard": False,
                    "runtime_env": runtime_env or None}
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


def run_runtime_env(cfg: Config) -> dict:
    """The Ray runtime environment a run's workers need: the user's reward modules that are not installed
    (``reward.functions`` paths) as ``py_modules``, so a module on the driver's PYTHONPATH reaches every node."""
    from dockflow.rewards.functions import shipped_modules

    modules = shipped_modules(cfg.reward)
    return {"py_modules": modules} if modules else {}


def disconnect() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def nodes_off_this_host() -> list[str]:
    """Addresses of the alive Ray nodes that are not this machine (empty: every node is here)."""
    import socket

    import ray

    here = {"127.0.0.1", "localhost", socket.gethostname(), ray.util.get_node_ip_address()}
    try:
        here.update(info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None))
    except OSError:
        pass
    return sorted({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} - here)


def local_inputs(cfg: Config) -> dict[str, str]:
    """The config's inputs and outputs that are paths on one machine's disk (not s3:// or a server)."""
    out: dict[str, str] = {}
    paths = {"model.path": cfg.model.path}
    if cfg.plan.has("pairs"):  # an offline algorithm's pairs file
        pairs = cfg.plan.section("pairs", PreferenceSection)
        paths[pairs.key_of("pairs_path")] = pairs.pairs_path
    if cfg.data.source == "file":
        paths.update({"data.train_path": cfg.data.train_path, "data.test_path": cfg.data.test_path})
    for key, value in paths.items():
        if value and not value.startswith("s3://"):
            out[key] = value
    if not (cfg.checkpoint.dir or "").startswith("s3://"):
        out["checkpoint.dir"] = cfg.checkpoint.dir or "<run.output_dir>/<run.name>/checkpoints"
    if not (cfg.tracking.uri or "").startswith(("http://", "https://", "databricks", "postgresql", "mysql")):
        out["tracking.uri"] = cfg.tracking.uri or "<run.output_dir>/mlflow.db"
    return out


def check_reachable_inputs(cfg: Config) -> None:
    """On a cluster whose nodes are not all this machine, refuse paths on one machine's disk: the workers and
    the supervisor run on other nodes (pods) and would not find them."""
    remote = nodes_off_this_host()
    local = local_inputs(cfg)
    if remote and local:
        key, value = next(iter(local.items()))
        raise ClusterError(
            f"{key}={value!r} is on this machine's disk, but the Ray cluster has nodes elsewhere ({', '.join(remote[:3])}): "
            "give an s3://bucket/... URI (MinIO) for models, data and checkpoints, and an MLflow server for tracking.uri"
            + (f" (also local: {', '.join(k for k in local if k != key)})" if len(local) > 1 else "")
        )
