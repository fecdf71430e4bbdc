"""How to reach an S3 endpoint (MinIO, AWS, any S3 API): options, credentials, URLs, the ``minio`` client.

Shared by the checkpoint store (``s3.py``) and by staged models and input files (``objects.py``); requests,
retries and error wording live in ``s3_bucket.py``.

- Options come from ``CheckpointConfig`` (``checkpoint.s3_*``), then the environment (``S3Options.from_config``):
  a run reaches its checkpoints, models and datasets through one endpoint with one set of keys.
- Credentials come from the environment of each process, never from the config, and are never logged, put in
  an error message or pickled: ``DOCKFLOW_S3_SECRET_DIR`` (a mounted Kubernetes Secret: files ``access-key``
  and ``secret-key``, optionally ``session-token``), else ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
  (+ ``AWS_SESSION_TOKEN``), else ``MINIO_ROOT_USER``/``MINIO_ROOT_PASSWORD``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import certifi
import urllib3
from urllib3.exceptions import (
    IncompleteRead,
    InvalidChunkLength,
    MaxRetryError,
    ProtocolError,
    ProxyError,
    SSLError,
)
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from dockflow.config import CheckpointConfig
from dockflow.storage.manifest import CheckpointError

# ``minio`` is imported where a client is made or its errors are read, never at import: it imports pycryptodome and
# cffi (0.7 s), which every process that imports ``dockflow.storage`` (each worker) would pay without reaching S3.
# An exception can only be one of minio's when minio is loaded, so the error helpers ask only then.
if TYPE_CHECKING:
    from minio import Minio

ENV_ENDPOINT = ("DOCKFLOW_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
ENV_REGION = ("AWS_REGION", "AWS_DEFAULT_REGION")
ENV_SECRET_DIR = "DOCKFLOW_S3_SECRET_DIR"
#: Credential pairs read from the environment, first complete pair wins (after the secret directory).
ENV_CREDENTIALS = (("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), ("MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD"))
#: File names accepted in the secret directory, first present wins: ours, the AWS variable names (a Secret
#: made with ``--from-env-file``), and the MinIO chart's keys.
SECRET_FILES = {
    "access": ("access-key", "AWS_ACCESS_KEY_ID", "rootUser"),
    "secret": ("secret-key", "AWS_SECRET_ACCESS_KEY", "rootPassword"),
    "token": ("session-token", "AWS_SESSION_TOKEN"),
}
AWS_ENDPOINT = "s3.amazonaws.com"

CRED_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "InvalidSecurity",
    "XMinioInvalidTokenId",
}
REGION_CODES = {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"}
_TRANSIENT_CODES = {
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "RequestTimeout",
    "XMinioServerNotInitialized",
}
_TRANSIENT_HTTP = (
    Urllib3Timeout,
    ProtocolError,
    MaxRetryError,
    IncompleteRead,
    InvalidChunkLength,
    ProxyError,
)
CRED_ADVICE = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or MINIO_ROOT_USER and MINIO_ROOT_PASSWORD), or "
    f"{ENV_SECRET_DIR} to a mounted Secret with files access-key and secret-key, to valid keys for this endpoint"
)


@dataclass(frozen=True, repr=False)
class Credentials:
    """S3 keys and where they came from; ``repr`` shows only the source."""

    access_key: str
    secret_key: str
    session_token: str | None
    source: str

    def __repr__(self) -> str:
        return f"Credentials(source={self.source!r})"


def _read_secret_file(directory: Path, names: tuple[str, ...]) -> str | None:
    for name in names:
        path = directory / name
        if path.is_file():
            return path.read_text(encoding="utf-8").strip()
    return None


def load_credentials(environ: Mapping[str, str] | None = None) -> Credentials | None:
    """Credentials of this process (see the module docstring for the order); None when there are none."""
    env = os.environ if environ is None else environ
    secret_dir = env.get(ENV_SECRET_DIR)
    if secret_dir:
        d = Path(secret_dir)
        if not d.is_dir():
            raise CheckpointError(
                f"{ENV_SECRET_DIR}={secret_dir} is not a directory: mount the S3 Secret there or unset it"
            )
        access, secret = (
            _read_secret_file(d, SECRET_FILES["access"]),
            _read_secret_file(d, SECRET_FILES["secret"]),
        )
        if not access or not secret:
            raise CheckpointError(
                f"{ENV_SECRET_DIR}={secret_dir} lacks the S3 keys: it needs a file named one of "
                f"{list(SECRET_FILES['access'])} (access key) and one of {list(SECRET_FILES['secret'])} (secret key)"
            )
        token = _read_secret_file(d, SECRET_FILES["token"]) or None
        return Credentials(access, secret, token, f"{ENV_SECRET_DIR}={secret_dir}")
    for key_var, secret_var in ENV_CREDENTIALS:
        if env.get(key_var) and env.get(secret_var):
            token = env.get("AWS_SESSION_TOKEN") if key_var.startswith("AWS_") else None
            return Credentials(env[key_var], env[secret_var], token or None, f"env {key_var}/{secret_var}")
    return None


def parse_s3_url(url: str, what: str = "checkpoint.dir") -> tuple[str, str]:
    """``'s3://bucket/a/b/' -> ('bucket', 'a/b')``; the prefix may be empty. ``what`` names the URL in errors."""
    if not url.startswith("s3://"):
        raise CheckpointError(f"{what} '{url}' is not an s3://bucket/prefix URL")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    try:
        from minio.helpers import check_bucket_name

        check_bucket_name(bucket, strict=True)
    except ValueError as exc:
        raise CheckpointError(f"{what} '{url}': invalid bucket name '{bucket}' ({exc})") from None
    prefix = prefix.strip("/")
    if any(p in ("", ".", "..") for p in prefix.split("/")) and prefix:
        raise CheckpointError(f"{what} '{url}': the key prefix '{prefix}' has an empty, '.' or '..' segment")
    return bucket, prefix


@dataclass(frozen=True)
class S3Options:
    """How to reach the endpoint: resolved once (config, then environment) in the process that opens the store."""

    endpoint: str = AWS_ENDPOINT  # host[:port]
    secure: bool = True
    region: str | None = None
    create_bucket: bool = False
    attempts: int = 4
    backoff_s: float = 0.5
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    endpoint_source: str = "default (AWS)"

    @property
    def endpoint_url(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.endpoint}"

    @classmethod
    def from_config(cls, cfg: CheckpointConfig, environ: Mapping[str, str] | None = None) -> S3Options:
        env = os.environ if environ is None else environ
        raw, source = cfg.s3_endpoint, "checkpoint.s3_endpoint"
        if not raw:
            var = next((v for v in ENV_ENDPOINT if env.get(v)), None)
            raw, source = (env[var], f"env {var}") if var else (AWS_ENDPOINT, "default (AWS)")
        endpoint, scheme_secure = _split_endpoint(raw, source)
        secure = cfg.s3_secure if cfg.s3_secure is not None else scheme_secure
        region = cfg.s3_region or next((env[v] for v in ENV_REGION if env.get(v)), None)
        copied = ("create_bucket", "attempts", "backoff_s", "connect_timeout_s", "read_timeout_s")
        settings = {name: getattr(cfg, f"s3_{name}") for name in copied}
        return cls(endpoint=endpoint, secure=secure, region=region, endpoint_source=source, **settings)


def _split_endpoint(raw: str, source: str) -> tuple[str, bool]:
    """``'http://minio:9000' -> ('minio:9000', False)``; no scheme: TLS on."""
    if "@" in raw:  # user:password@host; the message must not repeat it
        raise CheckpointError(
            f"the S3 endpoint from {source} holds credentials ('...@host'): give host:port only, and the keys "
            f"through the environment ({CRED_ADVICE.removeprefix('set ')})"
        )
    if "://" not in raw:
        raw_netloc, secure = raw, True
    else:
        parts = urlsplit(raw)
        if parts.scheme not in ("http", "https") or parts.path not in ("", "/") or parts.query:
            raise CheckpointError(
                f"S3 endpoint '{raw}' (from {source}) must be host:port or http(s)://host:port, without a path"
            )
        raw_netloc, secure = parts.netloc, parts.scheme == "https"
    if not raw_netloc or "/" in raw_netloc:
        raise CheckpointError(f"S3 endpoint '{raw}' (from {source}) must be host:port or http(s)://host:port")
    return raw_netloc, secure


def make_client(opts: S3Options) -> tuple[Minio, str | None]:
    """A client for ``opts`` with this process's credentials, and where they came from (None: anonymous).
    The client never retries by itself: ``S3Bucket.call`` does, bounded and worded."""
    from minio import Minio

    creds = load_credentials()
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=opts.connect_timeout_s, read=opts.read_timeout_s),
        retries=False,
        maxsize=10,
        cert_reqs="CERT_REQUIRED",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
    )
    client = Minio(
        opts.endpoint,
        access_key=creds.access_key if creds else None,
        secret_key=creds.secret_key if creds else None,
        session_token=creds.session_token if creds else None,
        secure=opts.secure,
        region=opts.region,
        http_client=http,
    )
    return client, creds.source if creds else None


def minio_error(exc: BaseException, *names: str) -> bool:
    """``exc`` is an instance of one of ``minio.error``'s classes ``names`` (False while minio is not loaded: then
    nothing raised one)."""
    errors = sys.modules.get("minio.error")
    return errors is not None and isinstance(exc, tuple(getattr(errors, n) for n in names))


def describe(exc: BaseException) -> str:
    """One line about an error from the client or the HTTP layer (never holds credentials: requests are
    signed in headers, and neither headers nor bodies of requests are part of these messages)."""
    if minio_error(exc, "S3Error"):
        text = f"{exc.code}: {exc.message}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:297] + "..."


def http_status(exc: BaseException) -> int | None:
    """The HTTP status behind a client error, when there is one."""
    if minio_error(exc, "S3Error"):
        return exc.response.status if exc.response is not None else None
    if minio_error(exc, "ServerError"):
        return exc.status_code
    if minio_error(exc, "InvalidResponseError"):
        return getattr(exc, "_code", None)
    return None


def is_transient(exc: BaseException) -> bool:
    """Worth another try: the network or the server failed, not the request."""
    if isinstance(exc, SSLError):
        return False
    if isinstance(exc, (*_TRANSIENT_HTTP, ConnectionError, TimeoutError)):
        return True
    if minio_error(exc, "S3Error") and exc.code in _TRANSIENT_CODES:
        return True
    status = http_status(exc)
    return status is not None and (status >= 500 or status == 429)
