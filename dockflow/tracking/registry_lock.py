"""A lock kept in MLflow's own Model Registry, so that overlapping runs take turns on the champion decision.

MLflow has no compare-and-swap on aliases, so ``decide_champion`` (``dockflow.tracking.champion``) reads the
champion's score and moves the alias while holding this lock. The primitive: the versions of a dedicated
registered model (``<model>.<alias>.lock``, tagged ``dockflow.lock=true``) are **tickets**. MLflow's SQL
registry store numbers a new version ``max(version) + 1`` inside a transaction on the primary key
``(name, version)`` (a clash is an IntegrityError and MLflow retries), and deleting a version only marks its
row deleted, so a number is never handed out twice, and every lower ticket is committed before a higher one
exists. That holds for every backend of the SQL store (SQLite, PostgreSQL, MySQL, MSSQL), directly or
behind ``mlflow server``, which calls the same store.

The protocol is a FIFO ticket queue with leases:

1. take a ticket (create a version; ``MLflow``'s own retries plus ours on a busy SQLite);
2. the lock is held when no live ticket with a lower number remains; waiting and holding, the owner touches
   its ticket (``update_model_version``, which stamps ``last_updated_timestamp`` with the store's clock)
   every ``stale_after_s / 4`` as a heartbeat (a daemon thread while holding);
3. a lower ticket whose last touch is older than ``stale_after_s`` belongs to a dead or stalled process and
   is deleted (it is broken, with a warning naming its owner); deleting names that ticket's number, which is
   never reused, so two waiters breaking the same ticket cannot delete anything else;
4. waiting longer than ``timeout_s`` gives up with ``RegistryLockTimeout`` naming the holder;
5. release deletes the own ticket (also when the guarded code raised).

Ages are measured on the store's clock: "now" is the own ticket's latest server timestamp plus the local
monotonic time since. Rejected alternative: a uniquely named registered model as a mutex is atomic to
create, but breaking a stale one is delete-then-create, and two breakers can delete each other's fresh lock.

Limits:

- It is a lease, not a fencing token: a holder whose process stalls (or loses the store) for longer than
  ``stale_after_s`` can be broken and then still write. ``check_held`` just before the write narrows that to
  one request's time.
- Timestamps come from the processes that write the store (the tracking server, or every client for a
  shared SQLite file): their clocks must agree (NTP) within a small part of ``stale_after_s``.
- Only SQL-backed registries: MLflow's file store (refused by default in MLflow 3.17) and Databricks/Unity
  Catalog registries do not number versions under a database constraint.
- Only callers that take the lock are ordered: moving the alias by hand in the UI bypasses it.
- Each decision leaves one deleted version row in the lock model; deleting the lock model while no
  decision runs is harmless (it is created again).
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from dataclasses import dataclass
from types import TracebackType

from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from dockflow.tracking.registry_client import (
    RegistryError,
    RegistryLockTimeout,
    ensure_registered_model,
    filter_by_name,
    retry_transient,
)

log = logging.getLogger(__name__)

LOCK_TAG = "dockflow.lock"
OWNER_TAG = "dockflow.lock.owner"
# A ticket's default source; decide_champion passes the candidate version's own source and run id instead, which
# any server-side source check (MLFLOW_CREATE_MODEL_VERSION_SOURCE_VALIDATION_REGEX, run containment) accepts.
TICKET_SOURCE = "dockflow-lock:/ticket"


@dataclass(frozen=True)
class Ticket:
    """One place in the lock's queue: a version of the lock model."""

    number: int
    touched_ms: int  # last heartbeat, on the store's clock
    owner: str
    run_id: str | None


class RegistryLock:
    """The FIFO lease lock above on lock model ``name``: ``with RegistryLock(...) as lock: ...``."""

    def __init__(
        self,
        client: MlflowClient,
        name: str,
        *,
        owner: str,
        timeout_s: float,
        stale_after_s: float,
        source: str = TICKET_SOURCE,
        run_id: str | None = None,
        poll_s: float = 0.25,
        description: str = "",
    ) -> None:
        self.client = client
        self.name = name
        self.owner = f"{owner} on {socket.gethostname()} pid {os.getpid()}"
        self.timeout_s = timeout_s
        self.stale_after_s = stale_after_s
        self.source = source
        self.run_id = run_id
        self.poll_s = min(poll_s, stale_after_s / 4)
        self.description = description or "DockFlow lock: each version is a queue ticket, not a model."
        self.ticket: Ticket | None = None
        self._anchor = (0, 0.0)  # (store ms, local monotonic s) of the own ticket's last touch
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._lost: RegistryError | None = None  # set by the heartbeat when the ticket was broken

    @property
    def uri(self) -> str:
        return self.client.tracking_uri

    def _now_ms(self) -> float:
        store_ms, local_s = self._anchor
        return store_ms + (time.monotonic() - local_s) * 1000.0

    def _stamp(self, mv: ModelVersion) -> None:
        self._anchor = (int(mv.last_updated_timestamp or mv.creation_timestamp), time.monotonic())

    def acquire(self) -> Ticket:
        """Take a ticket and wait for the turn; raises RegistryLockTimeout after ``timeout_s``."""
        if self.ticket is not None:
            raise RegistryError(f"lock {self.name} is already held by this object (ticket {self.ticket.number})")
        deadline = time.monotonic() + self.timeout_s
        ensure_registered_model(self.client, self.name, self.description, {LOCK_TAG: "true"})
        mv = retry_transient(
            lambda: self.client.create_model_version(
                self.name, self.source, run_id=self.run_id, tags={OWNER_TAG: self.owner},
                description=self.owner, await_creation_for=0,
            )
        )  # fmt: skip
        self._stamp(mv)
        self.ticket = Ticket(int(mv.version), self._anchor[0], self.owner, self.run_id)
        try:
            self._wait_turn(deadline)
            self._touch()
        except BaseException:
            self._delete_own()
            raise
        self._lost = None
        self._stop.clear()
        self._heartbeat = threading.Thread(target=self._beat, name=f"lock-heartbeat-{self.name}", daemon=True)
        self._heartbeat.start()
        return self.ticket

    def _beat(self) -> None:
        """Heartbeat while holding, until ``release``."""
        while not self._stop.wait(self.stale_after_s / 4):
            try:
                self._touch()
            except RegistryError as exc:
                self._lost = exc
                if not self._stop.is_set():
                    log.warning("%s", exc)
                return
            except Exception as exc:  # a missed beat; the next one may get through
                if not self._stop.is_set():
                    log.warning("heartbeat of lock ticket of %s failed: %s", self.name, exc)

    def _wait_turn(self, deadline: float) -> None:
        assert self.ticket is not None
        last_touch = time.monotonic()
        while True:
            ahead = [t for t in self.live_tickets() if t.number < self.ticket.number]
            now_ms = self._now_ms()
            for t in ahead:
                if now_ms - t.touched_ms > self.stale_after_s * 1000.0:
                    self._break(t, now_ms)
            ahead = [t for t in ahead if now_ms - t.touched_ms <= self.stale_after_s * 1000.0]
            if not ahead:
                return
            if time.monotonic() >= deadline:
                head = ahead[0]
                raise RegistryLockTimeout(
                    f"timed out after {self.timeout_s:g} s waiting for lock '{self.name}' at {self.uri}: "
                    f"ticket {head.number} is held by {head.owner} (run {head.run_id}), last active "
                    f"{(now_ms - head.touched_ms) / 1000:.1f} s ago, {len(ahead)} ticket(s) ahead; a ticket idle for "
                    f"{self.stale_after_s:g} s is broken as stale: retry, or raise registry.lock_timeout_s"
                )
            if time.monotonic() - last_touch >= self.stale_after_s / 4:
                self._touch()
                last_touch = time.monotonic()
            time.sleep(self.poll_s * (0.5 + random.random()))

    def live_tickets(self) -> list[Ticket]:
        """The queue: live tickets of the lock model, lowest first."""
        found = retry_transient(
            lambda: self.client.search_model_versions(
                filter_by_name(self.name), max_results=1000, order_by=["version_number ASC"]
            )
        )
        out = []
        for mv in found:
            touched = int(mv.last_updated_timestamp or mv.creation_timestamp)
            out.append(Ticket(int(mv.version), touched, mv.tags.get(OWNER_TAG, "unknown"), mv.run_id or None))
        return sorted(out, key=lambda t: t.number)

    def _break(self, t: Ticket, now_ms: float) -> None:
        log.warning(
            "breaking stale lock ticket %d of %s (owner %s, run %s, idle %.1f s > %g s)",
            t.number, self.name, t.owner, t.run_id, (now_ms - t.touched_ms) / 1000, self.stale_after_s,
        )  # fmt: skip
        self._delete(t.number)

    def _delete(self, number: int) -> None:
        try:
            retry_transient(lambda: self.client.delete_model_version(self.name, str(number)))
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":  # someone else broke or released it already
                raise

    def _touch(self) -> None:
        """Heartbeat: stamp the own ticket with the store's clock; raises RegistryError when it was broken."""
        assert self.ticket is not None
        try:
            mv = retry_transient(
                lambda: self.client.update_model_version(self.name, str(self.ticket.number), description=self.owner)
            )
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                raise self._broken_error() from None
            raise
        self._stamp(mv)

    def _broken_error(self) -> RegistryError:
        number = self.ticket.number if self.ticket else "?"
        return RegistryError(
            f"lock ticket {number} of '{self.name}' at {self.uri} was broken by another process after "
            f"{self.stale_after_s:g} s without a heartbeat (this process stalled): nothing was changed; retry, "
            "or raise registry.lock_timeout_s"
        )

    def check_held(self) -> None:
        """Raise RegistryError unless the own ticket still exists (call it right before the guarded write)."""
        if self.ticket is None:
            raise RegistryError(f"lock '{self.name}' at {self.uri} is not held: call acquire() first")
        if self._lost is not None:
            raise self._lost
        try:
            self.client.get_model_version(self.name, str(self.ticket.number))
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                raise self._broken_error() from None
            raise

    def _delete_own(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=self.stale_after_s)
            self._heartbeat = None
        if self.ticket is None:
            return
        number, self.ticket = self.ticket.number, None
        try:
            self._delete(number)
        except Exception as exc:  # the ticket goes stale and is broken later; do not hide the caller's error
            log.warning("could not release lock ticket %d of %s (%s); it expires in %g s",
                        number, self.name, exc, self.stale_after_s)

    def release(self) -> None:
        """Delete the own ticket; a failure is a warning (the ticket then expires as stale)."""
        self._delete_own()

    def __enter__(self) -> RegistryLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
