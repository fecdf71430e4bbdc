"""Ray token authentication for the clusters a run starts or joins (Ray 2.60: ``RAY_AUTH_MODE=token``).

Ray looks for the token in ``RAY_AUTH_TOKEN``, then in the file ``RAY_AUTH_TOKEN_PATH`` names, then in
``~/.ray/auth_token``; every Ray process (GCS, raylet, dashboard, workers) reads it from its environment, which
it inherits from the process that started it. So the embedded local cluster gets a fresh random token in this
process's environment before ``ray.init``: its workers, and every process this one starts (``kfp.local``'s
tasks, ``ray start``), have it; nothing else on the machine does. The token is never printed.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import MutableMapping
from pathlib import Path

MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
DEFAULT_TOKEN_FILE = Path("~/.ray/auth_token")


class RayAuthError(RuntimeError):
    """The token Ray was pointed to cannot be used; the message names the setting."""


def token_source(env: MutableMapping[str, str]) -> str | None:
    """Where Ray will take the token from (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``),
    in Ray's order; None when there is none."""
    if env.get(TOKEN_ENV):
        return TOKEN_ENV
    if env.get(TOKEN_PATH_ENV):
        return TOKEN_PATH_ENV
    home = env.get("HOME")
    default = Path(home) / ".ray" / "auth_token" if home else DEFAULT_TOKEN_FILE.expanduser()
    return str(DEFAULT_TOKEN_FILE) if default.is_file() and default.stat().st_size else None


def prepare_local_cluster(env: MutableMapping[str, str] | None = None) -> str:
    """Set up ``env`` (this process's environment) for a new local cluster: token auth unless the user set
    ``RAY_AUTH_MODE=disabled``; the user's token from ``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH``, else a new
    random one for this run (``~/.ray/auth_token`` is not used: any process of this user could read it).
    Returns the mode."""
    env = os.environ if env is None else env
    check_token_path(env)
    mode = env.setdefault(MODE_ENV, "token").lower()
    if mode == "token" and not (env.get(TOKEN_ENV) or env.get(TOKEN_PATH_ENV)):
        env[TOKEN_ENV] = secrets.token_hex(32)  # 256 bits, as `ray get-auth-token --generate`
    _refresh_ray(env)
    return mode


def prepare_join(env: MutableMapping[str, str] | None = None) -> None:
    """Set up ``env`` to join a running cluster: token auth on when the user gave a token (Ray itself turns it
    on for an explicit address only with ``RAY_AUTH_MODE=token``); ``RAY_AUTH_MODE`` as set otherwise."""
    env = os.environ if env is None else env
    check_token_path(env)
    if MODE_ENV not in env and token_source(env):
        env[MODE_ENV] = "token"
    _refresh_ray(env)


def check_token_path(env: MutableMapping[str, str]) -> None:
    """Raise RayAuthError when ``RAY_AUTH_TOKEN_PATH`` is Ray's source but names no readable, non-empty file
    (Ray would abort the process on it)."""
    path = env.get(TOKEN_PATH_ENV)
    if env.get(TOKEN_ENV) or not path:
        return
    try:
        empty = not Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise RayAuthError(f"{TOKEN_PATH_ENV}={path!r} cannot be read ({exc.strerror}): point it to the file "
                           f"holding the Ray cluster's token, or unset it") from None
    if empty:
        raise RayAuthError(f"{TOKEN_PATH_ENV}={path!r} is empty: write the Ray cluster's token into it, or unset it")


def _refresh_ray(env: MutableMapping[str, str]) -> None:
    """When Ray's native module is already loaded, make it read the mode and token again: it caches both at the
    first use (as Ray's own ``ray.init`` does when it turns token auth on)."""
    if env is not os.environ or "ray._raylet" not in sys.modules:
        return
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def refused_token(address: str, env: MutableMapping[str, str] | None = None, timeout_s: float = 10.0) -> str | None:
    """One line saying what to set when the head at ``address`` refuses this process's token (or its lack of
    one); None when it accepts it or the check cannot tell. A GCS address (``host:port``) is asked through
    Ray's GCS client, a ``ray://`` one through the Ray client server's ping; either answers in milliseconds,
    where ``ray.init`` retries for 20-30 s and ends with "connection timeout"."""
    env = os.environ if env is None else env
    refused = _client_refused(address, timeout_s) if address.startswith("ray://") else _gcs_refused(address)
    if not refused:
        return None
    source = token_source(env)
    if source is None or env.get(MODE_ENV, "").lower() == "disabled":
        given = "this process has no token" if source is None else f"{MODE_ENV}=disabled here"
        return (f"the Ray cluster at ray.address={address!r} requires a token (Ray token auth) and {given}: set "
                f"{TOKEN_ENV} to the cluster's token (or {TOKEN_PATH_ENV} to a file holding it) and "
                f"{MODE_ENV}=token; on Kubernetes it is key {TOKEN_ENV} of the Secret dockflow-ray")
    return (f"the Ray cluster at ray.address={address!r} refused the token from {source}: set {TOKEN_ENV} (or "
            f"{TOKEN_PATH_ENV}) to the cluster's token; on Kubernetes it is key {TOKEN_ENV} of the Secret "
            "dockflow-ray (rotated? restart the Ray pods and the clients with the new one)")


def _gcs_refused(address: str) -> bool:
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        GcsClient(address=address)
    except AuthenticationError:
        return True
    except Exception:  # noqa: BLE001 - anything else is ray.init's to report
        return False
    return False


def _client_refused(address: str, timeout_s: float) -> bool:
    import grpc
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc

    channel = init_grpc_channel(address.removeprefix("ray://"), asynchronous=False)
    try:
        stub = ray_client_pb2_grpc.RayletDriverStub(channel)
        stub.ClusterInfo(ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING),
                         timeout=timeout_s)
    except grpc.RpcError as exc:
        return exc.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()
    return False
