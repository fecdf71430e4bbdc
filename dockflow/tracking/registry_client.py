"""Shared helpers of the Model Registry modules: errors, a registry client, retries on a busy store, quoting."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from dockflow.tracking.store import TrackingError, apply_http_env_defaults, explain

_TRANSIENT_CODES = {"TEMPORARILY_UNAVAILABLE", "RESOURCE_EXHAUSTED", "REQUEST_LIMIT_EXCEEDED"}

T = TypeVar("T")


class RegistryError(TrackingError):
    """A Model Registry operation failed; the message names the model, the tracking URI and what to do."""


class RegistryLockTimeout(RegistryError):
    """Waiting for the registry lock took longer than its timeout; the message names the holder."""


def open_client(uri: str) -> MlflowClient:
    """An MlflowClient whose tracking and registry are both ``uri`` (HTTP waits bounded)."""
    apply_http_env_defaults()
    try:
        return MlflowClient(tracking_uri=uri, registry_uri=uri)
    except Exception as exc:
        raise RegistryError(f"tracking.uri '{uri}' cannot be used for the Model Registry: {explain(uri, exc)}") from exc


def call(uri: str, what: str, fn: Callable[[], T]) -> T:
    """``fn()`` with MLflow's errors turned into one-line RegistryErrors."""
    try:
        return fn()
    except RegistryError:
        raise
    except Exception as exc:
        raise RegistryError(f"{what}: {explain(uri, exc)}") from exc


def is_missing(exc: BaseException) -> bool:
    """MLflow's "no such model / version / run"."""
    return isinstance(exc, MlflowException) and exc.error_code == "RESOURCE_DOES_NOT_EXIST"


def is_transient(exc: BaseException) -> bool:
    """A busy store (SQLite locked, MLflow giving up on a version-number clash): worth another try."""
    if not isinstance(exc, MlflowException):
        return False
    return exc.error_code in _TRANSIENT_CODES or "Model Version creation error" in str(exc)


def retry_transient(fn: Callable[[], T], attempts: int = 8, base_s: float = 0.05) -> T:
    """``fn()``, retried with jittered backoff while it fails transiently (see ``is_transient``)."""
    for attempt in range(attempts):
        try:
            return fn()
        except MlflowException as exc:
            if attempt == attempts - 1 or not is_transient(exc):
                raise
            time.sleep(base_s * (2**attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def ensure_registered_model(client: MlflowClient, name: str, description: str, tags: dict[str, str]) -> bool:
    """Create registered model ``name`` unless it exists; another process creating it first is fine.
    Returns True when this call created it."""
    try:
        client.get_registered_model(name)
        return False
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
    try:
        retry_transient(lambda: client.create_registered_model(name, tags=tags, description=description))
        return True
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return False


def filter_by_name(name: str) -> str:
    """``name='...'`` for MLflow search filters (double quotes when the name holds a single quote)."""
    if "'" not in name:
        return f"name='{name}'"
    if '"' not in name:
        return f'name="{name}"'
    raise RegistryError(f"registered model name {name!r} holds both quote characters: rename it")


