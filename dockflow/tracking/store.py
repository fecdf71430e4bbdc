"""Where MLflow data goes: resolve the tracking URI, bound HTTP waits, word the errors, and keep a URI's password
out of the run link MLflow prints (``run_link_redacted``).

``tracking.uri: null`` means a SQLite store in the runs' output directory (``sqlite:///<run.output_dir>/mlflow.db``,
artifacts in ``<run.output_dir>/mlartifacts``), shared by every run there: one experiment, one Model Registry.
MLflow 3.17 refuses its file store (``./mlruns``) unless ``MLFLOW_ALLOW_FILE_STORE=true``, so SQLite is the local
default. View it with ``mlflow ui --backend-store-uri sqlite:///<run.output_dir>/mlflow.db``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from mlflow.environment_variables import MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT
from mlflow.exceptions import MlflowException

from dockflow.redact import redact_text

# HTTP bounds for a tracking server, applied when the user has not set them: an unreachable server fails in
# seconds instead of MLflow's default of minutes (120 s timeout, 7 retries with exponential backoff).
HTTP_ENV_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}

# MLflow error codes that mean "could not get through" rather than "the request itself is wrong".
_TRANSPORT_CODES = {"INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"}
# ... and those that mean "these credentials may not" (a server with auth: HTTP 401, 403).
_AUTH_CODES = {"UNAUTHENTICATED", "PERMISSION_DENIED"}


class TrackingError(RuntimeError):
    """MLflow tracking failed; the message names the tracking URI (its credentials hidden) and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(redact_text(str(message)))


def resolve_tracking_uri(uri: str | None, store_dir: str | Path) -> str:
    """The configured URI, or the local SQLite store in ``store_dir`` (created if needed)."""
    if uri:
        return uri
    store_dir = Path(store_dir).absolute()
    try:
        store_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrackingError(
            f"cannot create directory '{store_dir}' for the local MLflow store ({exc}): "
            "set run.output_dir to a writable directory, or tracking.uri to a tracking server"
        ) from None
    return f"sqlite:///{store_dir / 'mlflow.db'}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for any other store)."""
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def require_existing_store(uri: str) -> None:
    """Raise TrackingError when ``uri`` is a local store (sqlite or file) that does not exist; MLflow would
    create an empty one silently."""
    if (db := sqlite_path(uri)) is not None:
        path, what = db, "database file"
    elif uri.startswith("file:"):
        path, what = Path(urlparse(uri).path), "directory"
    elif "://" not in uri:
        path, what = Path(uri), "directory"
    else:
        return
    if not path.exists():
        raise TrackingError(
            f"MLflow store {uri} does not exist (no {what} {path}): check the path; a run with tracking.uri: null "
            "keeps its store in <run.output_dir>/mlflow.db"
        )


def default_artifact_location(uri: str) -> str | None:
    """For a SQLite store, artifacts live beside the database; other stores choose their own."""
    db = sqlite_path(uri)
    return None if db is None else (db.parent / "mlartifacts").absolute().as_uri()


def is_tracking_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def apply_http_env_defaults() -> None:
    """Bound MLflow's HTTP waits unless the user set these variables (MLflow reads them per request)."""
    for key, value in HTTP_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


def explain(uri: str, exc: BaseException) -> TrackingError:
    """A TrackingError that names the URI, MLflow's reason (first line) and what to do."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if len(reason) > 400:
        reason = reason[:400] + "..."
    if isinstance(exc, MlflowException) and exc.error_code in _AUTH_CODES:
        return TrackingError(
            f"MLflow at {uri} refused the credentials ({exc.error_code}: {reason}): set MLFLOW_TRACKING_USERNAME "
            "and MLFLOW_TRACKING_PASSWORD to a user of that server with access to the experiment"
        )
    if isinstance(exc, MlflowException) and exc.error_code not in _TRANSPORT_CODES:
        return TrackingError(
            f"MLflow at {uri} rejected the request ({exc.error_code}: {reason}): fix the value it names "
            "(MLflow limits key names, lengths and batch sizes)"
        )
    if is_tracking_server(uri):
        timeout = os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", "?")
        retries = os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "?")
        return TrackingError(
            f"MLflow tracking server {uri} failed ({reason}; timeout {timeout}s, {retries} retries): "
            f"check that the server is running and reachable (curl {uri}/health), fix tracking.uri, "
            "or set tracking.uri: null to use a local store in run.output_dir"
        )
    return TrackingError(
        f"MLflow store {uri} failed ({reason}): check that its path is writable and was not created by a "
        "newer MLflow, or set tracking.uri to another store or a tracking server"
    )


@contextmanager
def run_link_redacted(uri: str, experiment_id: str, run_id: str) -> Iterator[None]:
    """MLflow prints the run's link, built from the tracking URI as given, when the run ends: with a password in
    the URI (``http://user:pw@host``) its print is turned off for the call, and this prints the link redacted."""
    shown = redact_text(uri)
    if shown == uri or not is_tracking_server(uri):
        yield
        return
    name = MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.name
    before = os.environ.get(name)
    os.environ[name] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
    print(f"🏃 View run {run_id} at: {shown.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}", flush=True)
