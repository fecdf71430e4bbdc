"""Checkpoint store on S3 or MinIO (any S3 endpoint), through the ``minio`` client.

    store = open_store(cfg.checkpoint, run_dir)     # checkpoint.dir: s3://bucket/prefix
    store.write_part(10, "actor", model.state_dict()) # any process (Ray actors too), one name each
    store.commit(10, {"iteration": 10})               # one process, after all writers are done
    step = store.latest(); state = store.read_part(step, "actor")

Same layout and commit rule as the local store, under the key prefix: ``<prefix>/step-000010/actor.safetensors``,
``actor.safetensors.json`` (the part's record), and ``manifest.json`` PUT last. A PUT (or a completed multipart upload)
is atomic, so readers never see half an object and a checkpoint exists iff its manifest object exists.

- Transfers stream: ``write_part`` writes the data-only part through a hashing writer into a spooled temporary file
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

The S3 plumbing (options, credentials, URLs, client, retries, error wording) is shared with staged models and
input files: ``s3_client.py`` and ``s3_bucket.py``.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from dockflow.config import CheckpointConfig
from dockflow.storage.checkpoint_store import CheckpointStore, Fetched
from dockflow.storage.fault_points import pause_point
from dockflow.storage.manifest import (
    MANIFEST_NAME,
    CheckpointError,
    HashingWriter,
    PartInfo,
    part_filename,
    step_dirname,
    steps_of_paths,
)
from dockflow.storage.s3_bucket import PART_SIZE, S3Bucket
from dockflow.storage.s3_client import (
    Credentials,
    S3Options,
    is_transient,
    load_credentials,
    parse_s3_url,
)
from dockflow.storage.write_errors import no_room

if TYPE_CHECKING:  # minio is imported when a request is made (s3_client.py says why)
    from minio import Minio

__all__ = ["Credentials", "S3CheckpointStore", "S3Options", "is_transient", "load_credentials", "parse_s3_url"]

SPOOL_BYTES = 16 << 20  # a part is staged in memory up to this size, then in a temp file


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
        self._s3 = S3Bucket(self.bucket, self.options)  # pickles without its client
        self._s3.ensure(self._root, self.options.create_bucket)

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

    @property
    def _client(self) -> Minio:
        return self._s3.client

    @property
    def _root(self) -> str:
        """Key prefix of every checkpoint: ``'prefix/'``, or ``''`` at the top of the bucket."""
        return f"{self.prefix}/" if self.prefix else ""

    def _key(self, step: int, filename: str = "") -> str:
        return f"{self._root}{step_dirname(step)}/{filename}"

    # ---- backend primitives ----

    def location(self, step: int | None = None) -> str:
        return self.url if step is None else f"s3://{self.bucket}/{self._key(step)}".rstrip("/")

    def _save_part(self, step: int, name: str, obj: Any) -> PartInfo:
        key = self._key(step, part_filename(name))
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as f:
            w = HashingWriter(f)
            try:
                self._encode(obj, w)
            except OSError as exc:
                reason = no_room(exc) or str(exc)
                raise CheckpointError(
                    f"cannot stage checkpoint part s3://{self.bucket}/{key} in the temp directory "
                    f"{tempfile.gettempdir()} ({reason}): free space there or set TMPDIR to a directory with room"
                ) from None
            info = PartInfo(name=name, size=w.size, sha256=w.sha256)
            pause_point(f"save.{step}.{name}")

            def put() -> None:
                f.seek(0)
                self._client.put_object(
                    self.bucket, key, f, info.size, part_size=PART_SIZE, metadata={"sha256": info.sha256}
                )

            self._s3.call("upload", key, put)
        return info

    def _put_text(self, step: int, filename: str, text: str) -> None:
        self._s3.put_bytes(self._key(step, filename), text.encode("utf-8"))

    def _get_text(self, step: int, filename: str) -> str | None:
        return self._s3.get_text(self._key(step, filename))

    def _list(self, key_prefix: str) -> dict[str, int]:
        """Every object under ``key_prefix``: name relative to it -> size."""
        return {o.object_name[len(key_prefix) :]: o.size or 0 for o in self._s3.list(key_prefix)}

    def _list_files(self, step: int) -> dict[str, int]:
        return {name: size for name, size in self._list(self._key(step)).items() if "/" not in name}

    def _list_all(self) -> dict[int, bool]:
        return steps_of_paths(self._list(self._root))

    @contextlib.contextmanager
    def _fetch(self, step: int, filename: str, keep_data: bool) -> Iterator[Fetched]:
        key = self._key(step, filename)
        with contextlib.ExitStack() as stack:
            tmp = stack.enter_context(tempfile.TemporaryFile()) if keep_data else None
            got = self._s3.download(key, tmp)
            if got is None:
                yield None
                return
            if tmp is not None:
                tmp.seek(0)
            yield (tmp, got.size, got.sha256)

    def delete(self, step: int) -> None:
        manifest_key = self._key(step, MANIFEST_NAME)
        self._s3.call("delete", manifest_key, lambda: self._client.remove_object(self.bucket, manifest_key))
        keys = [self._key(step, name) for name in self._list_files(step)]
        from minio.deleteobjects import DeleteObject

        def remove() -> None:
            errors = list(self._client.remove_objects(self.bucket, [DeleteObject(k) for k in keys]))
            if errors:
                raise CheckpointError(
                    f"cannot delete {len(errors)} objects of {self.location(step)} (first: {errors[0].code}: "
                    f"{errors[0].message} on {errors[0].name})"
                )

        if keys:
            self._s3.call("delete", self._key(step), remove)
