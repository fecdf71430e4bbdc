"""One bucket at one S3 endpoint: requests retried on transient errors, failures worded as one-line errors.

    b = S3Bucket("models", S3Options.from_config(cfg.checkpoint))
    b.ensure("qwen", create=False)                    # endpoint, keys and bucket checked by one listing
    got = b.download("qwen/config.json", file)        # Downloaded (size, sha256, ETag, ...) or None if missing
    b.upload_file("qwen/config.json", path, size, sha256)

Every request goes through ``call``: connection errors, timeouts, HTTP 5xx and 429 are retried with exponential
backoff (``attempts`` tries at most); anything else raises a ``CheckpointError`` that names the endpoint,
bucket and key and says what to do. The client is built lazily from this process's credentials and is not
pickled (the object travels to Ray actors; each process builds its own client).
"""

from __future__ import annotations

import io
import logging
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import urllib3
from urllib3.exceptions import SSLError

from dockflow.storage.manifest import CheckpointError, HashingWriter
from dockflow.storage.s3_client import (
    CRED_ADVICE,
    CRED_CODES,
    REGION_CODES,
    S3Options,
    describe,
    http_status,
    is_transient,
    make_client,
    minio_error,
)

if TYPE_CHECKING:  # minio is imported when a request is made (s3_client.py says why)
    from minio import Minio
    from minio.datatypes import Object

log = logging.getLogger(__name__)
T = TypeVar("T")

PART_SIZE = 16 << 20  # multipart part size, also what the client holds in memory per request
CHUNK = 1 << 20
MAX_BACKOFF_S = 30.0
#: What a missing bucket's message advises for the checkpoint store (``{bucket}`` is filled in).
CHECKPOINT_BUCKET_ADVICE = (
    "create it (e.g. `mc mb <alias>/{bucket}`), set checkpoint.s3_create_bucket: true, or set checkpoint.dir to "
    "s3://<an existing bucket>/<prefix>"
)
ALL_PERMISSIONS = "s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject"
SHA256_HEADER = "x-amz-meta-sha256"  # what ``upload_file`` (and the checkpoint store) put on every object
_MD5_ETAG = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class Downloaded:
    """What a download saw: the bytes' size, sha256 and MD5 (when asked), the response's ETag and
    ``x-amz-meta-sha256``, and whether the object is server-side encrypted (then its ETag is no MD5)."""

    size: int
    sha256: str
    md5: str | None
    etag: str
    meta_sha256: str | None
    encrypted: bool

    @property
    def etag_is_md5(self) -> bool:
        """A single-part, unencrypted upload's ETag is the MD5 of its bytes (32 hex digits, no ``-N``)."""
        return not self.encrypted and _MD5_ETAG.fullmatch(self.etag) is not None


class S3Bucket:
    """Requests to ``bucket`` at ``options.endpoint``. ``missing_advice``: what a missing bucket's error says
    to do; ``permissions``: what an AccessDenied error asks to grant."""

    def __init__(
        self,
        bucket: str,
        options: S3Options,
        missing_advice: str = CHECKPOINT_BUCKET_ADVICE,
        permissions: str = ALL_PERMISSIONS,
    ) -> None:
        self.bucket = bucket
        self.options = options
        self.missing_advice = missing_advice
        self.permissions = permissions
        self._client_obj: Minio | None = None
        self._creds_source: str | None = None

    def __repr__(self) -> str:
        return f"S3Bucket({self.bucket!r}, endpoint={self.options.endpoint_url!r})"

    # Sent to Ray actors: the client (sockets, locks, credentials) stays behind.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client_obj"] = None
        return state

    @property
    def client(self) -> Minio:
        """The ``minio`` client, built on first use from this process's credentials."""
        if self._client_obj is None:
            self._client_obj, self._creds_source = make_client(self.options)
        return self._client_obj

    def url(self, key: str | None) -> str:
        return f"s3://{self.bucket}/{key or ''}"

    # ---- errors and retries ----

    def no_bucket_message(self) -> str:
        return (
            f"S3 bucket '{self.bucket}' does not exist at {self.options.endpoint_url}: "
            + self.missing_advice.replace("{bucket}", self.bucket)
        )

    def error(self, op: str, key: str | None, exc: BaseException) -> CheckpointError:
        """A one-line CheckpointError for a failure that another try would not fix."""
        opts = self.options
        head = f"S3 {op} {self.url(key)} at {opts.endpoint_url} failed"
        code = exc.code if minio_error(exc, "S3Error") else None
        source = self._creds_source
        if code in CRED_CODES:
            msg = f"{head}: the endpoint rejected the credentials from {source} ({code}): {CRED_ADVICE}"
        elif code == "AccessDenied" and source is None:
            msg = f"{head}: access denied and no S3 credentials were found: {CRED_ADVICE}"
        elif code == "AccessDenied":
            msg = (
                f"{head}: access denied for the credentials from {source}: grant them {self.permissions} on "
                f"bucket '{self.bucket}', or use other credentials"
            )
        elif code == "NoSuchBucket":
            msg = self.no_bucket_message()
        elif code in REGION_CODES:
            msg = f"{head} ({describe(exc)}): set checkpoint.s3_region (or AWS_REGION) to the bucket's region"
        elif isinstance(exc, SSLError):
            msg = (
                f"{head}: TLS failed ({describe(exc)}): if the endpoint serves plain HTTP set checkpoint.s3_secure: "
                "false (or use an http:// endpoint); for a private CA set SSL_CERT_FILE to its certificate"
            )
        elif minio_error(exc, "InvalidResponseError"):
            msg = (
                f"{head}: the answer is not from an S3 API (HTTP {http_status(exc)}): check checkpoint.s3_endpoint "
                f"(from {opts.endpoint_source}); for MinIO use the API port (usually 9000), not the console"
            )
        elif isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
            msg = f"{head} ({describe(exc)}): check free space in the temp directory {tempfile.gettempdir()}"
        else:
            msg = f"{head} ({describe(exc)})"
        return CheckpointError(msg)

    def call(self, op: str, key: str | None, fn: Callable[[], T]) -> T:
        """Run one request, retrying transient failures with exponential backoff; CheckpointError otherwise."""
        from minio.error import MinioException

        opts = self.options
        t0 = time.monotonic()
        for attempt in range(1, opts.attempts + 1):
            try:
                return fn()
            except (MinioException, urllib3.exceptions.HTTPError, OSError) as exc:
                if not is_transient(exc):
                    raise self.error(op, key, exc) from None
                if attempt == opts.attempts:
                    raise CheckpointError(
                        f"S3 {op} {self.url(key)} at {opts.endpoint_url} failed after {attempt} "
                        f"{'try' if attempt == 1 else 'tries'} in {time.monotonic() - t0:.1f} s "
                        f"(last: {describe(exc)}): check that the S3 server is up and "
                        f"reachable from this host and that checkpoint.s3_endpoint (now from {opts.endpoint_source}) "
                        "and checkpoint.s3_secure are right; raise checkpoint.s3_attempts for a flaky network"
                    ) from None
                wait = min(opts.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
                log.warning(
                    "S3 %s %s at %s failed (%s); try %d of %d in %.1f s",
                    *(op, self.url(key), opts.endpoint_url, describe(exc), attempt + 1, opts.attempts, wait),
                )
                time.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    # ---- requests ----

    def ensure(self, root: str, create: bool) -> None:
        """Fail early: endpoint, credentials and bucket are checked by one listing request under ``root`` (a
        key prefix, ``''`` for the whole bucket); a missing bucket is created with ``create``."""
        from minio.error import S3Error

        def probe() -> bool:
            try:
                next(iter(self.client.list_objects(self.bucket, prefix=root or None)), None)
            except S3Error as exc:
                if exc.code == "NoSuchBucket":
                    return False
                raise
            return True

        if self.call("list", root.rstrip("/"), probe):
            return
        if not create:
            raise CheckpointError(self.no_bucket_message())

        def make() -> None:
            try:
                self.client.make_bucket(self.bucket, location=self.options.region)
            except S3Error as exc:
                if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

        self.call("create bucket", None, make)
        log.info("created S3 bucket %s at %s", self.bucket, self.options.endpoint_url)

    def _stream(self, key: str, sink: BinaryIO | None, md5: bool) -> Downloaded | None:
        from minio.error import S3Error

        if sink is not None:
            sink.seek(0)
            sink.truncate()
        w = HashingWriter(sink, md5=md5)
        try:
            resp = self.client.get_object(self.bucket, key)
        except S3Error as exc:
            if exc.code == "NoSuchKey":
                return None
            raise
        try:
            for chunk in resp.stream(CHUNK):
                w.write(chunk)
            headers = resp.headers
        finally:
            resp.close()
            resp.release_conn()
        encrypted = any(h.lower().startswith("x-amz-server-side-encryption") for h in headers)
        etag = (headers.get("etag") or "").strip('"')
        return Downloaded(w.size, w.sha256, w.md5, etag, headers.get(SHA256_HEADER), encrypted)

    def download(self, key: str, sink: BinaryIO | None, md5: bool = False) -> Downloaded | None:
        """Stream an object into ``sink`` (a seekable file, or None to only hash it): its size and sha256 (and
        MD5 with ``md5``); None when the object does not exist. A retry starts the sink over."""
        return self.call("download", key, lambda: self._stream(key, sink, md5))

    def get_text(self, key: str) -> str | None:
        """A small UTF-8 object, or None when it does not exist."""
        with io.BytesIO() as buf:
            got = self.download(key, buf)
            return None if got is None else buf.getvalue().decode("utf-8")

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/json") -> None:
        """PUT a small object (atomic: readers see all of it or nothing)."""
        self.call(
            "upload",
            key,
            lambda: self.client.put_object(self.bucket, key, io.BytesIO(data), len(data), content_type=content_type),
        )

    def upload_file(self, key: str, path: Path, size: int, sha256: str) -> None:
        """Upload a local file in ``PART_SIZE`` parts, its sha256 as the object's ``x-amz-meta-sha256``."""

        def put() -> None:
            with open(path, "rb") as f:
                self.client.put_object(self.bucket, key, f, size, part_size=PART_SIZE, metadata={"sha256": sha256})

        self.call("upload", key, put)

    def list(self, key_prefix: str) -> list[Object]:
        """Every object (not folder marker) whose key starts with ``key_prefix``, recursively."""
        objs = self.call(
            "list",
            key_prefix,
            lambda: list(self.client.list_objects(self.bucket, prefix=key_prefix or None, recursive=True)),
        )
        return [o for o in objs if o.object_name and not o.is_dir]

    def stat(self, key: str) -> Object | None:
        """The object's size, ETag and metadata (a HEAD request); None when it does not exist."""
        from minio.error import S3Error

        def head() -> Object | None:
            try:
                return self.client.stat_object(self.bucket, key)
            except S3Error as exc:
                if exc.code in ("NoSuchKey", "NoSuchObject", "ResourceNotFound"):
                    return None
                raise

        return self.call("stat", key, head)
