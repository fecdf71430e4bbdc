"""Checkpoint store on S3 or MinIO (any S3 endpoint), through the ``minio`` client.

    store = open_store(cfg.checkpoint, run_dir)     # checkpoint.dir: s3://bucket/prefix
    store.write_part(10, "actor", model.state_dict()) # any process (Ray actors too), one name each
    store.commit(10, {"iteration": 10})               # one process, after all writers are done
    step = store.latest(); state = store.read_part(step, "actor")

Same layout and commit rule as the local store, under the key prefix: ``<prefix>/step-000010/actor.pt``,
``actor.pt.json`` (the part's record), and ``manifest.json`` PUT last. A PUT (or a completed multipart upload)
is atomic, so readers never see half an object and a checkpoint exists iff its manifest object exists.

- Transfers stream: ``write_part`` runs ``torch.save`` through a hashing writer into a spooled temporary file
  (memory up to 16 MiB, then the temp directory), then uploads it in 16 MiB parts; ``read_part`` streams the
  object into a temporary file, checks its size and sha256 against the manifest, and only then loads it.
- Every request is retried on transient errors (connection refused/reset, timeouts, HTTP 5xx, 429) with
  exponential backoff, ``checkpoint.s3_attempts`` tries at most; timeouts are short, so nothing hangs. Other
  failures (credentials, missing bucket, TLS mismatch, not an S3 server) raise a one-line CheckpointError
  that names the endpoint, bucket and key and says what to do.
- Credentials come from the environment of each process, never from the config, and are never logged, put in
  an error message or pickled: ``DOCKFLOW_S3_SECRET_DIR`` (a mounted Kubernetes Secret: files ``access-key``
  and ``secret-key``, optionally ``session-token``), else ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``
  (+ ``AWS_SESSION_TOKEN``), else ``MINIO_ROOT_USER``/``MINIO_ROOT_PASSWORD``. The store pickles (it is sent
  to Ray actors) without its client; the receiving process builds its own from its own environment.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import certifi
import torch
import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import InvalidResponseError, MinioException, S3Error, ServerError
from minio.helpers import check_bucket_name
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
from dockflow.storage.base import CheckpointStore, Fetched
from dockflow.storage.manifest import (
    MANIFEST_NAME,
    CheckpointError,
    HashingWriter,
    PartInfo,
    part_filename,
    step_dirname,
    steps_of_paths,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

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
PART_SIZE = 16 << 20  # multipart part size, also what the client holds in memory per request
SPOOL_BYTES = 16 << 20  # a part is staged in memory up to this size, then in a temp file
CHUNK = 1 << 20
MAX_BACKOFF_S = 30.0

_CRED_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "InvalidSecurity",
    "XMinioInvalidTokenId",
}
_REGION_CODES = {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"}
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
_CRED_ADVICE = (
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


def parse_s3_url(url: str) -> tuple[str, str]:
    """``'s3://bucket/a/b/' -> ('bucket', 'a/b')``; the prefix may be empty."""
    if not url.startswith("s3://"):
        raise CheckpointError(f"checkpoint.dir '{url}' is not an s3://bucket/prefix URL")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    try:
        check_bucket_name(bucket, strict=True)
    except ValueError as exc:
        raise CheckpointError(f"checkpoint.dir '{url}': invalid bucket name '{bucket}' ({exc})") from None
    prefix = prefix.strip("/")
    if any(p in ("", ".", "..") for p in prefix.split("/")) and prefix:
        raise CheckpointError(
            f"checkpoint.dir '{url}': the key prefix '{prefix}' has an empty, '.' or '..' segment"
        )
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
            f"through the environment ({_CRED_ADVICE.removeprefix('set ')})"
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


def _describe(exc: BaseException) -> str:
    """One line about an error from the client or the HTTP layer (never holds credentials: requests are
    signed in headers, and neither headers nor bodies of requests are part of these messages)."""
    if isinstance(exc, S3Error):
        text = f"{exc.code}: {exc.message}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:297] + "..."


def _status(exc: BaseException) -> int | None:
    if isinstance(exc, S3Error):
        return exc.response.status if exc.response is not None else None
    if isinstance(exc, ServerError):
        return exc.status_code
    if isinstance(exc, InvalidResponseError):
        return getattr(exc, "_code", None)
    return None


def is_transient(exc: BaseException) -> bool:
    """Worth another try: the network or the server failed, not the request."""
    if isinstance(exc, SSLError):
        return False
    if isinstance(exc, (*_TRANSIENT_HTTP, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, S3Error) and exc.code in _TRANSIENT_CODES:
        return True
    status = _status(exc)
    return status is not None and (status >= 500 or status == 429)


class S3CheckpointStore(CheckpointStore):
    """Checkpoints under ``s3://bucket/prefix/step-NNNNNN/``; see the module docstring."""

    def __init__(
        self,
        url: str,
        keep: int,
        options: S3Options | None = None,
        best_metric: str | None = None,
        best_mode: Literal["max", "min"] = "max",
    ) -> None:
        super().__init__(keep, best_metric, best_mode)
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.options = options or S3Options.from_config(CheckpointConfig())
        self._client_obj: Minio | None = None
        self._check_bucket()

    @classmethod
    def from_config(cls, url: str, cfg: CheckpointConfig) -> S3CheckpointStore:
        """The store for ``url`` with the endpoint, retry and retention settings of ``cfg``."""
        return cls(
            url,
            keep=cfg.keep,
            options=S3Options.from_config(cfg),
            best_metric=cfg.best_metric if cfg.keep_best else None,
            best_mode=cfg.best_mode,
        )

    def __repr__(self) -> str:
        return f"S3CheckpointStore({self.url!r}, endpoint={self.options.endpoint_url!r}, keep={self.keep})"

    # The store is sent to Ray actors: the client (sockets, locks, credentials) stays behind.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client_obj"] = None
        return state

    # ---- the client, requests, errors ----

    @property
    def _client(self) -> Minio:
        if self._client_obj is None:
            opts = self.options
            creds = load_credentials()
            self._creds_source = creds.source if creds else None
            http = urllib3.PoolManager(
                timeout=urllib3.Timeout(connect=opts.connect_timeout_s, read=opts.read_timeout_s),
                retries=False,  # retries are ours (_call): bounded, with backoff, and worded
                maxsize=10,
                cert_reqs="CERT_REQUIRED",
                ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
            )
            self._client_obj = Minio(
                opts.endpoint,
                access_key=creds.access_key if creds else None,
                secret_key=creds.secret_key if creds else None,
                session_token=creds.session_token if creds else None,
                secure=opts.secure,
                region=opts.region,
                http_client=http,
            )
        return self._client_obj

    @property
    def _root(self) -> str:
        """Key prefix of every checkpoint: ``'prefix/'``, or ``''`` at the top of the bucket."""
        return f"{self.prefix}/" if self.prefix else ""

    def _key(self, step: int, filename: str = "") -> str:
        return f"{self._root}{step_dirname(step)}/{filename}"

    def _error(self, op: str, key: str | None, exc: BaseException) -> CheckpointError:
        """A one-line CheckpointError for a failure that another try would not fix."""
        opts = self.options
        head = f"S3 {op} s3://{self.bucket}/{key or ''} at {opts.endpoint_url} failed"
        code = exc.code if isinstance(exc, S3Error) else None
        source = getattr(self, "_creds_source", None)
        if code in _CRED_CODES:
            msg = f"{head}: the endpoint rejected the credentials from {source} ({code}): {_CRED_ADVICE}"
        elif code == "AccessDenied" and source is None:
            msg = f"{head}: access denied and no S3 credentials were found: {_CRED_ADVICE}"
        elif code == "AccessDenied":
            msg = (
                f"{head}: access denied for the credentials from {source}: grant them s3:ListBucket, s3:GetObject, "
                f"s3:PutObject and s3:DeleteObject on bucket '{self.bucket}', or use other credentials"
            )
        elif code == "NoSuchBucket":
            msg = self._no_bucket_message()
        elif code in _REGION_CODES:
            msg = (
                f"{head} ({_describe(exc)}): set checkpoint.s3_region (or AWS_REGION) to the bucket's region"
            )
        elif isinstance(exc, SSLError):
            msg = (
                f"{head}: TLS failed ({_describe(exc)}): if the endpoint serves plain HTTP set checkpoint.s3_secure: "
                "false (or use an http:// endpoint); for a private CA set SSL_CERT_FILE to its certificate"
            )
        elif isinstance(exc, InvalidResponseError):
            msg = (
                f"{head}: the answer is not from an S3 API (HTTP {_status(exc)}): check checkpoint.s3_endpoint "
                f"(from {opts.endpoint_source}); for MinIO use the API port (usually 9000), not the console"
            )
        elif isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
            msg = f"{head} ({_describe(exc)}): check free space in the temp directory {tempfile.gettempdir()}"
        else:
            msg = f"{head} ({_describe(exc)})"
        return CheckpointError(msg)

    def _no_bucket_message(self) -> str:
        return (
            f"S3 bucket '{self.bucket}' does not exist at {self.options.endpoint_url}: create it (e.g. "
            f"`mc mb <alias>/{self.bucket}`), set checkpoint.s3_create_bucket: true, or set checkpoint.dir to "
            "s3://<an existing bucket>/<prefix>"
        )

    def _call(self, op: str, key: str | None, fn: Callable[[], T]) -> T:
        """Run one request, retrying transient failures with exponential backoff; CheckpointError otherwise."""
        opts = self.options
        t0 = time.monotonic()
        for attempt in range(1, opts.attempts + 1):
            try:
                return fn()
            except (MinioException, urllib3.exceptions.HTTPError, OSError) as exc:
                if not is_transient(exc):
                    raise self._error(op, key, exc) from None
                if attempt == opts.attempts:
                    raise CheckpointError(
                        f"S3 {op} s3://{self.bucket}/{key or ''} at {opts.endpoint_url} failed after {attempt} "
                        f"{'try' if attempt == 1 else 'tries'} in {time.monotonic() - t0:.1f} s "
                        f"(last: {_describe(exc)}): check that the S3 server is up and "
                        f"reachable from this host and that checkpoint.s3_endpoint (now from {opts.endpoint_source}) "
                        "and checkpoint.s3_secure are right; raise checkpoint.s3_attempts for a flaky network"
                    ) from None
                wait = min(opts.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
                log.warning(
                    "S3 %s s3://%s/%s at %s failed (%s); try %d of %d in %.1f s",
                    *(
                        op,
                        self.bucket,
                        key or "",
                        opts.endpoint_url,
                        _describe(exc),
                        attempt + 1,
                        opts.attempts,
                        wait,
                    ),
                )
                time.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    def _check_bucket(self) -> None:
        """Fail early, in the process that opens the store: endpoint, credentials and bucket are checked by
        one listing request; a missing bucket is created with ``create_bucket``."""

        def probe() -> bool:
            try:
                next(iter(self._client.list_objects(self.bucket, prefix=self._root or None)), None)
            except S3Error as exc:
                if exc.code == "NoSuchBucket":
                    return False
                raise
            return True

        if self._call("list", self.prefix, probe):
            return
        if not self.options.create_bucket:
            raise CheckpointError(self._no_bucket_message())

        def create() -> None:
            try:
                self._client.make_bucket(self.bucket, location=self.options.region)
            except S3Error as exc:
                if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

        self._call("create bucket", None, create)
        log.info("created S3 bucket %s at %s", self.bucket, self.options.endpoint_url)

    # ---- backend primitives ----

    def location(self, step: int | None = None) -> str:
        return self.url if step is None else f"s3://{self.bucket}/{self._key(step)}".rstrip("/")

    def _save_part(self, step: int, name: str, obj: Any) -> PartInfo:
        key = self._key(step, part_filename(name))
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as f:
            w = HashingWriter(f)
            try:
                torch.save(obj, w)
            except OSError as exc:
                raise CheckpointError(
                    f"cannot stage checkpoint part s3://{self.bucket}/{key} ({exc}): "
                    f"check free space in the temp directory {tempfile.gettempdir()} (or set TMPDIR)"
                ) from None
            info = PartInfo(name=name, size=w.size, sha256=w.sha256)

            def put() -> None:
                f.seek(0)
                self._client.put_object(
                    self.bucket, key, f, info.size, part_size=PART_SIZE, metadata={"sha256": info.sha256}
                )

            self._call("upload", key, put)
        return info

    def _put_text(self, step: int, filename: str, text: str) -> None:
        key, data = self._key(step, filename), text.encode("utf-8")

        def put() -> None:
            self._client.put_object(
                self.bucket, key, io.BytesIO(data), len(data), content_type="application/json"
            )

        self._call("upload", key, put)

    def _download(self, key: str, sink: Any) -> tuple[int, str] | None:
        """Stream an object into ``sink`` (a file, or None to only hash it): (size, sha256), None if missing."""
        if sink is not None:
            sink.seek(0)
            sink.truncate()
        w = HashingWriter(sink)
        try:
            resp = self._client.get_object(self.bucket, key)
        except S3Error as exc:
            if exc.code == "NoSuchKey":
                return None
            raise
        try:
            for chunk in resp.stream(CHUNK):
                w.write(chunk)
        finally:
            resp.close()
            resp.release_conn()
        return w.size, w.sha256

    def _get_text(self, step: int, filename: str) -> str | None:
        key = self._key(step, filename)
        with io.BytesIO() as buf:
            got = self._call("download", key, lambda: self._download(key, buf))
            return None if got is None else buf.getvalue().decode("utf-8")

    def _list(self, key_prefix: str) -> dict[str, int]:
        """Every object under ``key_prefix``: name relative to it -> size."""
        objs = self._call(
            "list",
            key_prefix,
            lambda: list(self._client.list_objects(self.bucket, prefix=key_prefix or None, recursive=True)),
        )
        return {o.object_name[len(key_prefix) :]: o.size or 0 for o in objs if o.object_name and not o.is_dir}

    def _list_files(self, step: int) -> dict[str, int]:
        return {name: size for name, size in self._list(self._key(step)).items() if "/" not in name}

    def _list_all(self) -> dict[int, bool]:
        return steps_of_paths(self._list(self._root))

    @contextlib.contextmanager
    def _fetch(self, step: int, filename: str, keep_data: bool) -> Iterator[Fetched]:
        key = self._key(step, filename)
        with contextlib.ExitStack() as stack:
            tmp = stack.enter_context(tempfile.TemporaryFile()) if keep_data else None
            got = self._call("download", key, lambda: self._download(key, tmp))
            if got is None:
                yield None
                return
            if tmp is not None:
                tmp.seek(0)
            yield (tmp, *got)

    def delete(self, step: int) -> None:
        manifest_key = self._key(step, MANIFEST_NAME)
        self._call("delete", manifest_key, lambda: self._client.remove_object(self.bucket, manifest_key))
        keys = [self._key(step, name) for name in self._list_files(step)]

        def remove() -> None:
            errors = list(self._client.remove_objects(self.bucket, [DeleteObject(k) for k in keys]))
            if errors:
                raise CheckpointError(
                    f"cannot delete {len(errors)} objects of {self.location(step)} (first: {errors[0].code}: "
                    f"{errors[0].message} on {errors[0].name})"
                )

        if keys:
            self._call("delete", self._key(step), remove)
