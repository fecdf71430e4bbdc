"""Connect to a Ray cluster, or start the embedded local one (token auth with a token of its own, no dashboard)."""

from __future__ import annotations

import os
from collections.abc import Callable

from dockflow.algos.plan import RunPlan
from dockflow.config import Config, RayConfig
from dockflow.config.algorithm import PreferenceSection
from dockflow.workers import ray_auth


class ClusterError(RuntimeError):
    """Ray could not be started or reached; the message says which address and what to do."""


def run_namespace(cfg: Config) -> str:
    """The Ray namespace of a run's actors: ``ray.namespace``, or one named after the run."""
    return cfg.ray.namespace or f"dockflow-{cfg.run.name}"


def connect(cfg: RayConfig, namespace: str, runtime_env: dict | None = None) -> bool:
    """``ray.init`` for this run: join ``cfg.address`` when set, else start a local cluster. ``runtime_env``: the
    job's (``run_runtime_env``: the user's reward modules, shipped to every worker). Token auth
    (``dockflow.workers.ray_auth``): the local cluster gets a token of its own unless ``RAY_AUTH_MODE=disabled``;
    a joined one the user's (``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH``), with one line when the head refuses it.

    Returns False when this process was already connected (the caller then must not shut Ray down)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict = {"namespace": namespace, "log_to_driver": True, "include_dashboard": False,
                    "runtime_env": runtime_env or None}
    try:
        if cfg.address:
            ray_auth.prepare_join()
        else:
            ray_auth.prepare_local_cluster()
    except ray_auth.RayAuthError as exc:
        raise ClusterError(str(exc)) from None
    if cfg.address:
        kwargs.pop("include_dashboard")
        probe_head(cfg.address, cfg.head_timeout_s)  # ray.init would wait minutes for a head that is not there
        refused = head_endpoint(cfg.address) and ray_auth.refused_token(cfg.address, timeout_s=cfg.head_timeout_s)
        if refused:  # ray.init would retry for 20-30 s, then say only "connection timeout"
            raise ClusterError(refused)
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


def head_endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) that answers for the head at ``address`` (``host:port`` or ``ray://host:port``); None for
    ``auto`` and other forms Ray resolves itself."""
    rest = address.removeprefix("ray://")
    host, _, port = rest.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def head_reachable(endpoint: tuple[str, int], timeout_s: float = 2.0) -> bool:
    """A TCP connection to the head's port opens within ``timeout_s``."""
    import socket

    try:
        with socket.create_connection(endpoint, timeout=timeout_s):
            return True
    except OSError:
        return False


def probe_head(address: str, timeout_s: float) -> None:
    """Raise ClusterError when the head at ``address`` does not accept a connection within ``timeout_s``."""
    import time

    endpoint = head_endpoint(address)
    if endpoint is None:
        return
    deadline = time.monotonic() + timeout_s
    while not head_reachable(endpoint, min(2.0, timeout_s)):
        if time.monotonic() >= deadline:
            raise ClusterError(
                f"no Ray head answers at ray.address={address!r} (waited {timeout_s:.0f}s, ray.head_timeout_s): start "
                "it (ray start --head --port PORT) or fix the address; ray.address: null starts a local cluster"
            )
        time.sleep(0.5)


class HeadWatch:
    """Watches the joined cluster's head from this driver: when it stays unreachable for ``timeout_s``, calls
    ``on_lost(message)`` once (from the watch thread; Ray itself would kill this process only after 60 s, with
    its own multi-line message). ``stop()`` ends the watch."""

    def __init__(self, address: str, timeout_s: float, on_lost: Callable[[str], None], interval_s: float = 1.0) -> None:
        import threading

        self.address, self.timeout_s, self.on_lost, self.interval_s = address, timeout_s, on_lost, interval_s
        self.endpoint = head_endpoint(address)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True, name="ray-head-watch")
        if self.endpoint is not None:
            self.thread.start()

    def _watch(self) -> None:
        import time

        down_since: float | None = None
        while not self._stop.wait(self.interval_s):
            if head_reachable(self.endpoint, min(2.0, self.timeout_s)):
                down_since = None
                continue
            down_since = time.monotonic() if down_since is None else down_since
            if time.monotonic() - down_since >= self.timeout_s and not self._stop.is_set():
                self.on_lost(f"lost the Ray head at {self.address} (unreachable for {self.timeout_s:.0f}s, "
                             "ray.head_timeout_s)")
                return

    def stop(self) -> None:
        self._stop.set()


def joined_address() -> str:
    """The GCS address (host:port) of the cluster this process is connected to."""
    import ray

    return ray.get_runtime_context().gcs_address


def run_runtime_env(cfg: Config) -> dict:
    """The Ray runtime environment a run's workers need: the user's reward modules that are not installed
    (``reward.functions`` paths) and tool modules (``tools:``) as ``py_modules``, so a module on the driver's
    PYTHONPATH reaches every node."""
    from dockflow.rewards.functions import shipped_modules, user_module_dirs

    tools = user_module_dirs(cfg.tools.paths)
    modules = list(dict.fromkeys([*shipped_modules(cfg.reward), *tools]))
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


def local_inputs(cfg: Config, plan: RunPlan) -> dict[str, str]:
    """The config's inputs and outputs that are paths on one machine's disk (not s3:// or a server); ``plan``: the
    run plan (an offline algorithm's pair source reads a pairs file)."""
    out: dict[str, str] = {}
    paths = {"model.path": cfg.model.path}
    if plan.has("pairs"):  # an offline algorithm's pairs file
        pairs = plan.section("pairs", PreferenceSection)
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


def check_reachable_inputs(cfg: Config, plan: RunPlan) -> None:
    """On a cluster whose nodes are not all this machine, refuse paths on one machine's disk: the workers and
    the supervisor run on other nodes (pods) and would not find them."""
    remote = nodes_off_this_host()
    local = local_inputs(cfg, plan)
    if remote and local:
        key, value = next(iter(local.items()))
        raise ClusterError(
            f"{key}={value!r} is on this machine's disk, but the Ray cluster has nodes elsewhere ({', '.join(remote[:3])}): "
            "give an s3://bucket/... URI (MinIO) for models, data and checkpoints, and an MLflow server for tracking.uri"
            + (f" (also local: {', '.join(k for k in local if k != key)})" if len(local) > 1 else "")
        )
