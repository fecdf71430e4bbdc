"""A model of the network, for benchmarks: the paper's bandwidth model (MindSpeed RL, Table 1's T100/T1K).

Off by default (``create_dock(spec)``, what a run calls; a benchmark passes ``create_dock(spec,
link=LinkSpec(mib_per_s))``): then nothing here runs and the dock behaves and performs as
without it. When on, every node has one modelled link of ``mib_per_s`` MiB/s, shared by all dock processes
on that node (warehouses, controllers, the central buffer). Each transfer into or out of a dock process that
crosses nodes takes ``bytes / bandwidth`` of wall time on that process's node link; transfers on one link are
serialised (a reservation: start when the link is free, hold it for the transfer's duration); the process
waits with ``asyncio.sleep``, using no CPU. Node-local transfers are free, and worker endpoints are not
modelled (as in Eqs. 2 and 4, which count bytes at the dock's processes). The same rule applies to every
backend DockFlow implements, so it is a model of the network, not of either design.

``LinkClock`` is the arithmetic (the protocol simulator uses it on a virtual clock); ``NodeLink`` keeps one
clock per node in a small file under ``/dev/shm`` locked with ``flock``, so the processes of a node share it
without a message (a few microseconds per transfer). ``time.monotonic`` is system-wide on Linux, so the
processes of one machine agree on it; the key is unique per dock, so docks never share links.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import shutil
import struct
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from dockflow.dock.errors import DockInvalid

MIB = 2**20
_DOUBLE = struct.Struct("d")


@dataclass(frozen=True)
class LinkSpec:
    """What a dock process needs to model its node's link: the bandwidth and the dock's unique key."""

    mib_per_s: float
    key: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        if not self.mib_per_s > 0:
            raise DockInvalid(f"a modelled link's mib_per_s must be positive, not {self.mib_per_s}")

    def seconds(self, nbytes: int) -> float:
        """How long ``nbytes`` hold a link."""
        return nbytes / (self.mib_per_s * MIB)


class LinkClock:
    """One link's reservations: a transfer starts when the link is free (or now) and holds it for its duration."""

    def __init__(self, mib_per_s: float) -> None:
        self.spec = LinkSpec(mib_per_s, key="clock")
        self.free_at = 0.0
        self.busy_s = 0.0
        self.bytes = 0

    def reserve(self, now: float, nbytes: int) -> float:
        """Reserve the link for ``nbytes`` from ``now`` on; returns when that transfer ends."""
        duration = self.spec.seconds(nbytes)
        self.free_at = max(now, self.free_at) + duration
        self.busy_s += duration
        self.bytes += nbytes
        return self.free_at


def links_dir(key: str) -> Path:
    """Where the clocks of one dock's node links live (shared memory where the machine has it)."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / "dockflow-links" / re.sub(r"[^A-Za-z0-9_.-]", "_", key)


def remove_links(key: str) -> None:
    """Delete this machine's link clocks of a dock (other machines' files, 8 bytes each, stay)."""
    shutil.rmtree(links_dir(key), ignore_errors=True)


class NodeLink:
    """The modelled link of the node a dock process runs on, shared with the node's other dock processes."""

    def __init__(self, spec: LinkSpec, node_id: str) -> None:
        self.spec = spec
        self.node_id = node_id
        path = links_dir(spec.key) / f"{node_id}.clock"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.bytes = 0  # cross-node bytes this process moved over the link
        self.busy_s = 0.0  # link time those bytes held
        self.wait_s = 0.0  # time this process's transfers spent waiting for and on the link

    def reserve(self, nbytes: int, now: float) -> float:
        """Reserve the node's link for ``nbytes`` (under the file lock); returns the seconds until it ends."""
        duration = self.spec.seconds(nbytes)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            raw = os.pread(self._fd, _DOUBLE.size, 0)
            free_at = _DOUBLE.unpack(raw)[0] if len(raw) == _DOUBLE.size else 0.0
            end = max(now, free_at) + duration
            os.pwrite(self._fd, _DOUBLE.pack(end), 0)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self.bytes += nbytes
        self.busy_s += duration
        return end - now

    async def transfer(self, nbytes: int, peer_node: str | None) -> None:
        """Hold this node's link for a transfer of ``nbytes`` to or from ``peer_node``; free if it is this node."""
        if peer_node is None or peer_node == self.node_id or nbytes <= 0:
            return
        delay = self.reserve(nbytes, time.monotonic())
        self.wait_s += delay
        if delay > 0:
            await asyncio.sleep(delay)

    def stats(self) -> dict[str, float]:
        return {"link_bytes": self.bytes, "link_busy_s": round(self.busy_s, 6), "link_wait_s": round(self.wait_s, 6)}
