"""One MLflow run of a DockFlow run: params, metrics, artifacts, status.

    with Tracker.start(cfg.tracking, cfg.run.output_dir, cfg.run.name, params=cfg.flat(), tags={"algo": "grpo"}) as tr:
        tr.log_metrics({"train/reward_mean": 0.4, "timing/iteration_s": 2.1}, step=it)
        tr.log_artifact(run_dir / "curves.png")
    # leaving the block ends the run FINISHED, or FAILED if an exception escaped

Only ``MlflowClient`` calls with explicit run ids are used, never MLflow's global active run, so several trackers
can live in one process and Ray workers are unaffected. Metric names follow ``train/...``, ``eval/...``,
``timing/...`` (see docs/storage_and_tracking.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

from dockflow.config.base import flatten_dict
from dockflow.config.sections import TrackingConfig
from dockflow.file_lock import exclusive_lock
from dockflow.redact import redact_value
from dockflow.tracking.store import (
    TrackingError,
    apply_http_env_defaults,
    default_artifact_location,
    explain,
    require_existing_store,
    resolve_tracking_uri,
    run_link_redacted,
    sqlite_path,
)
from dockflow.tracking.system_metrics import start_system_metrics

log = logging.getLogger(__name__)

RunStatus = Literal["FINISHED", "FAILED", "KILLED"]

#: Metric steps held in memory during a tracking outage; older ones go to the run's ``metrics_unsent.jsonl``.
MAX_DEFERRED_STEPS = 10_000
#: After a failed send, the training loop's next try waits this long, doubled per failure up to the max (the
#: checkpoint's and the run's end's flushes always try): an outage costs a failed request per interval, not one
#: per iteration.
OUTAGE_RETRY_S = 5.0
OUTAGE_RETRY_MAX_S = 60.0
#: At the run's end, held metrics are retried this long while tracking is unreachable, then written to a file.
FINAL_FLUSH_WAIT_S = 30.0
METRICS_UNSENT = "metrics_unsent.jsonl"


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts become dotted keys; values become strings cut to MLflow's limit (with a warning), their
    secrets hidden (``dockflow.redact``: a URI's password, a key named like a secret)."""
    out: dict[str, str] = {}
    for name, value in flatten_dict(params, prefix).items():
        text = str(redact_value(name, value))
        if len(text) > MAX_PARAM_VAL_LENGTH:
            log.warning("param %s is %d chars; MLflow keeps %d, truncating", name, len(text), MAX_PARAM_VAL_LENGTH)
            text = text[: MAX_PARAM_VAL_LENGTH - 3] + "..."
        out[name] = text
    return out


def _metrics(metrics: Mapping[str, float], step: int, timestamp_ms: int) -> list[Metric]:
    """MLflow metrics of one step; non-finite values are skipped with a warning."""
    batch = []
    for key, value in metrics.items():
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"metric {key!r} must be a number, got {type(value).__name__}") from None
        if not math.isfinite(x):
            log.warning("metric %s is %s at step %d; not logged", key, x, step)
            continue
        batch.append(Metric(key, x, timestamp_ms, int(step)))
    return batch


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _experiment_id(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":  # another process created it just now
                raise
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if exp.lifecycle_stage != "active":
        raise TrackingError(
            f"MLflow experiment '{name}' at {client.tracking_uri} is deleted: restore it "
            f"(mlflow experiments restore --experiment-id {exp.experiment_id}) or set tracking.experiment"
        )
    return exp.experiment_id


def _existing_run(client: MlflowClient, run_id: str, hint: str) -> Run:
    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        raise TrackingError(f"MLflow run {run_id} does not exist in {client.tracking_uri}: {hint}") from None


def _reopen(client: MlflowClient, run_id: str) -> None:
    _existing_run(client, run_id, "resume with the tracking.uri that holds it, or start a new run (run_id=None)")
    client.update_run(run_id, status="RUNNING")


STORE_LOCK_TIMEOUT_S = 300.0  # creating a new store took 11-38 s on 2 loaded cores (docs/storage_and_tracking.md)


def _open_client(uri: str) -> MlflowClient:
    """The client of ``uri``. A SQLite store is opened under a lock beside it: MLflow creates and migrates a new
    store's tables on first use, and two runs doing that at once fail (``table _alembic_tmp_... already exists``)."""
    apply_http_env_defaults()
    db = sqlite_path(uri)
    turns = (exclusive_lock(db.with_name(f".{db.name}.lock"), "runs that create this store at once may fail",
                            timeout_s=STORE_LOCK_TIMEOUT_S, held_by="another process opening this MLflow store")
             if db is not None and db.parent.is_dir() else contextlib.nullcontext())
    try:
        with turns:
            return MlflowClient(tracking_uri=uri)
    except Exception as exc:
        raise TrackingError(
            f"tracking.uri '{uri}' cannot be used ({str(exc).strip().splitlines()[0][:300]}): use "
            "http(s)://host:port, sqlite:///path/to/mlflow.db, or null for a local store in run.output_dir"
        ) from exc


class Tracker:
    """An open MLflow run; create it with ``Tracker.start`` (or ``Tracker.attach`` to add to a finished run)."""

    def __init__(self, client: MlflowClient, run_id: str, experiment_id: str, monitor: Any = None,
                 flush_every_s: float = 0.0) -> None:
        self._client = client
        self._deferred: list[tuple[int, list[Metric]]] = []  # (step, its metrics, stamped): not sent yet
        self._flush_every_s = flush_every_s
        self._sent_at = time.monotonic()
        self._retry_at = 0.0  # monotonic time before which the training loop does not try again (an outage)
        self._failures = 0
        self.spill_to: Path | None = None  # where held steps over MAX_DEFERRED_STEPS go (Tracker.start sets it)
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.ended = False
        self._monitor = monitor  # SystemMetricsMonitor when tracking.system_metrics is on

    @property
    def tracking_uri(self) -> str:
        return self._client.tracking_uri

    @classmethod
    def start(
        cls,
        cfg: TrackingConfig,
        store_dir: str | Path,
        run_name: str,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        run_id: str | None = None,
    ) -> Tracker:
        """Open a new run (or reopen ``run_id`` when resuming) and log ``params`` (nested dicts are flattened).
        ``store_dir`` holds the local store when ``cfg.uri`` is null (runs pass ``run.output_dir``, so every run
        there shares one store and one Model Registry).

        Raises TrackingError naming the URI when the store or server cannot be used."""
        uri = resolve_tracking_uri(cfg.uri, store_dir)
        all_tags = {"dockflow.output_dir": str(Path(store_dir).absolute()),
                    **{k: str(redact_value(k, v)) for k, v in (tags or {}).items()}}
        client = _open_client(uri)
        resumed = run_id is not None
        try:
            exp_id = _experiment_id(client, cfg.experiment, default_artifact_location(uri))
            if run_id is None:
                run = client.create_run(exp_id, run_name=run_name, tags=all_tags)
                run_id = run.info.run_id
            else:
                _reopen(client, run_id)
        except TrackingError:
            raise
        except Exception as exc:  # MLflow wraps connection errors inconsistently (MlflowException, requests, OSError)
            raise explain(uri, exc) from exc
        tracker = cls(client, run_id, exp_id, flush_every_s=cfg.flush_every_s)
        tracker.spill_to = Path(store_dir) / run_name / METRICS_UNSENT
        if params:
            tracker.log_params(params)
        if cfg.system_metrics:
            tracker._monitor = start_system_metrics(uri, run_id, cfg.system_metrics_interval_s, resume=resumed)
        return tracker

    @classmethod
    def attach(cls, cfg: TrackingConfig, store_dir: str | Path, run_id: str) -> Tracker:
        """Log more to an existing run (e.g. ``dockflow eval --mlflow-run``) without changing its status;
        do not call ``end`` on it. Raises TrackingError when the run does not exist."""
        uri = resolve_tracking_uri(cfg.uri, store_dir)
        require_existing_store(uri)
        client = _open_client(uri)
        try:
            run = _existing_run(client, run_id, "check the run id and tracking.uri")
        except TrackingError:
            raise
        except Exception as exc:
            raise explain(uri, exc) from exc
        return cls(client, run_id, run.info.experiment_id)

    def params(self) -> dict[str, str]:
        """The run's params as MLflow stores them (strings)."""
        return dict(self._call("reading params", self._client.get_run, self.run_id).data.params)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            err = explain(self.tracking_uri, exc)
            raise TrackingError(f"{what} for run {self.run_id}: {err}") from exc

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log params in batches. Params already on the run (when resuming) are kept: MLflow cannot change them,
        so a changed value is a warning and the old one stays."""
        flat = flatten_params(params)
        existing = self._call("reading params", self._client.get_run, self.run_id).data.params
        for key in sorted(k for k in flat if k in existing and existing[k] != flat[k]):
            log.warning("param %s changed (%r -> %r) but MLflow params are immutable; keeping the old value",
                        key, existing[key], flat[key])
        todo = [Param(k, v) for k, v in flat.items() if k not in existing]
        for batch in _chunks(todo, MAX_PARAMS_TAGS_PER_BATCH):
            self._call("logging params", self._client.log_batch, self.run_id, params=batch)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        batch = [RunTag(k, str(redact_value(k, v))) for k, v in tags.items()]
        for chunk in _chunks(batch, MAX_PARAMS_TAGS_PER_BATCH):
            self._call("setting tags", self._client.log_batch, self.run_id, tags=chunk)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> int:
        """Log scalar metrics at ``step``; non-finite values are skipped with a warning. Returns the number logged."""
        batch = _metrics(metrics, step, int(time.time() * 1000))
        for chunk in _chunks(batch, MAX_METRICS_PER_BATCH):
            self._call("logging metrics", self._client.log_batch, self.run_id, metrics=chunk)
        return len(batch)

    def log_metrics_or_defer(self, metrics: Mapping[str, float], step: int) -> bool:
        """Like ``log_metrics``, for the training loop: the metrics (stamped now) go out with the others of the
        last ``tracking.flush_every_s`` seconds in one batch (a write per iteration costs the driver CPU that, on a
        small machine, the model worker's threads need), and a tracking outage (after MLflow's own retries) does
        not stop training: they wait in memory, with a warning, and go out with the next batch that gets through.
        Returns False while metrics wait because of an outage; ``flush`` sends them now, ``flush_deferred``
        reports what could not be sent. During an outage the next try waits ``OUTAGE_RETRY_S`` (doubled per
        failure, ``OUTAGE_RETRY_MAX_S`` at most), and at most ``MAX_DEFERRED_STEPS`` steps are held: older ones
        are written to ``spill_to``."""
        self._deferred.append((step, _metrics(metrics, step, int(time.time() * 1000))))
        if len(self._deferred) > MAX_DEFERRED_STEPS and self.spill_to is not None:
            self._spill(self.spill_to, len(self._deferred) - MAX_DEFERRED_STEPS)
        now = time.monotonic()
        if now - self._sent_at < self._flush_every_s:
            return True
        if now < self._retry_at:
            return False
        return self.flush()

    def flush(self) -> bool:
        """Send every metric ``log_metrics_or_defer`` holds, in batches of whole steps. Returns False (with a
        warning) when tracking is unreachable; they stay held."""
        try:
            while self._deferred:
                steps, batch = 0, []
                for _, rows in self._deferred:
                    if batch and len(batch) + len(rows) > MAX_METRICS_PER_BATCH:
                        break
                    batch += rows
                    steps += 1
                for chunk in _chunks(batch, MAX_METRICS_PER_BATCH):  # one step of more than a batch: several
                    self._call("logging metrics", self._client.log_batch, self.run_id, metrics=chunk)
                del self._deferred[:steps]
        except TrackingError as exc:
            self._failures += 1
            wait = min(OUTAGE_RETRY_S * 2 ** (self._failures - 1), OUTAGE_RETRY_MAX_S)
            self._retry_at = time.monotonic() + wait
            if self._failures == 1 or self._failures % 10 == 0:
                log.warning("tracking is unreachable; %d metric step(s) wait to be sent (next try in %.0f s): %s",
                            len(self._deferred), wait, exc)
            return False
        if self._failures:
            log.warning("tracking is reachable again after %d failed send(s); the held metrics went out",
                        self._failures)
        self._sent_at, self._failures, self._retry_at = time.monotonic(), 0, 0.0
        return True

    def flush_deferred(self, spill_to: str | Path, wait_s: float = FINAL_FLUSH_WAIT_S) -> int:
        """Send the metrics ``log_metrics_or_defer`` still holds, trying again for ``wait_s`` while tracking is
        unreachable; what still fails is written as JSON lines to ``spill_to`` (so nothing is lost) and reported.
        Returns the number of steps spilled."""
        deadline = time.monotonic() + wait_s
        while not self.flush():
            if time.monotonic() >= deadline:
                break
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        else:
            return 0
        spilled = len(self._deferred)
        self._spill(spill_to, spilled)
        log.warning("tracking stayed unreachable for %.0f s (FINAL_FLUSH_WAIT_S): %d metric step(s) written to %s "
                    "instead", wait_s, spilled, spill_to)
        return spilled

    def _spill(self, path: str | Path, steps: int) -> None:
        """Write the oldest ``steps`` held steps (their stamps too) to ``path`` as JSON lines, and drop them."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with Path(path).open("a") as f:
            for step, rows in self._deferred[:steps]:
                metrics = {m.key: m.value for m in rows}
                stamp = rows[0].timestamp if rows else None
                f.write(json.dumps({"step": step, "timestamp_ms": stamp, "metrics": metrics}) + "\n")
        del self._deferred[:steps]

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file (or a directory's files) into the run's artifacts, under ``artifact_path``."""
        p = Path(path)
        if not p.exists():
            raise TrackingError(f"artifact {p} does not exist: write it before logging it")
        fn = self._client.log_artifacts if p.is_dir() else self._client.log_artifact
        self._call(f"logging artifact {p}", fn, self.run_id, str(p), artifact_path)

    def log_dict(self, data: Mapping[str, Any], artifact_file: str) -> None:
        """Store a dict as a JSON (``.json``) or YAML (``.yaml``) artifact."""
        self._call(f"logging {artifact_file}", self._client.log_dict, self.run_id, dict(data), artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        self._call(f"logging {artifact_file}", self._client.log_text, self.run_id, text, artifact_file)

    def metric_history(self, key: str) -> list[tuple[int, float]]:
        """``[(step, value), ...]`` of one metric of this run, by step."""
        return read_metric_history(self.tracking_uri, self.run_id, key)

    def end(self, status: RunStatus = "FINISHED") -> None:
        """Mark the run ended; later calls do nothing."""
        if self.ended:
            return
        if self._deferred and not self.flush():  # a run that fails still logs what it measured, when it can
            log.warning("run %s ends with %d metric step(s) unsent: tracking is unreachable", self.run_id,
                        len(self._deferred))
        if self._monitor is not None:
            self._monitor.finish()  # flush its last samples while the run still accepts them
            self._monitor = None
        with run_link_redacted(self.tracking_uri, self.experiment_id, self.run_id):
            self._call("ending the run", self._client.set_terminated, self.run_id, status)
        self.ended = True

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            status: RunStatus = "FINISHED"
        elif issubclass(exc_type, KeyboardInterrupt):
            status = "KILLED"
        else:
            status = "FAILED"
        try:
            self.end(status)
        except TrackingError as err:
            if exc_type is None:
                raise
            log.warning("could not mark run %s %s: %s", self.run_id, status, err)


def read_metric_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """``[(step, value), ...]`` of metric ``key`` of run ``run_id`` in the store at ``uri``, sorted by step."""
    apply_http_env_defaults()
    try:
        hist = MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)
    except Exception as exc:
        raise explain(uri, exc) from exc
    return [(m.step, m.value) for m in sorted(hist, key=lambda m: (m.step, m.timestamp))]
