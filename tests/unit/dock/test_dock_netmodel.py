"""The bandwidth model's links: reservations serialise transfers on one node's link, node-local transfers are
free, the processes of one node share its link, and different docks never share links."""

import asyncio
import time

import pytest

from dockflow.dock.api import DockInvalid, DockSpec
from dockflow.dock.netmodel import MIB, LinkClock, LinkSpec, NodeLink, links_dir, remove_links


def test_link_clock_serialises_transfers():
    link = LinkClock(100.0)  # 100 MiB/s: 1 MiB holds it 10 ms
    assert link.reserve(0.0, MIB) == pytest.approx(0.01)
    assert link.reserve(0.0, MIB) == pytest.approx(0.02)  # queued behind the first
    assert link.reserve(1.0, 2 * MIB) == pytest.approx(1.02)  # an idle link starts at once
    assert link.busy_s == pytest.approx(0.04) and link.bytes == 4 * MIB


@pytest.fixture
def spec():
    s = LinkSpec(100.0)
    yield s
    remove_links(s.key)


def test_processes_of_one_node_share_its_link(spec):
    warehouse, controller = NodeLink(spec, "node-a"), NodeLink(spec, "node-a")
    now = time.monotonic()
    first = warehouse.reserve(MIB, now)
    second = controller.reserve(MIB, now)
    assert first == pytest.approx(0.01, abs=1e-6)
    assert second == pytest.approx(0.02, abs=1e-6)  # the other process's transfer held the link first
    other = NodeLink(spec, "node-b")
    assert other.reserve(MIB, now) == pytest.approx(0.01, abs=1e-6)  # another node, another link
    assert (links_dir(spec.key) / "node-a.clock").exists()


def test_transfer_waits_only_when_it_crosses_nodes(spec):
    link = NodeLink(spec, "node-a")

    async def run() -> tuple[float, float]:
        started = time.perf_counter()
        await link.transfer(5 * MIB, "node-a")  # node-local: free
        local = time.perf_counter() - started
        await link.transfer(5 * MIB, "node-b")  # 50 ms on this node's link
        return local, time.perf_counter() - started - local

    local, remote = asyncio.run(run())
    assert local < 0.005
    assert remote >= 0.045
    assert link.stats()["link_bytes"] == 5 * MIB
    assert link.stats()["link_busy_s"] == pytest.approx(0.05)


def test_docks_have_their_own_links():
    a, b = LinkSpec(100.0), LinkSpec(100.0)
    try:
        assert a.key != b.key and links_dir(a.key) != links_dir(b.key)
    finally:
        remove_links(a.key)
        remove_links(b.key)


def test_the_production_spec_has_no_network_model_and_a_link_rejects_nonsense():
    import dataclasses

    assert "nic_mib_per_s" not in {f.name for f in dataclasses.fields(DockSpec)}  # the benchmark passes a link
    with pytest.raises(DockInvalid, match="mib_per_s"):
        LinkSpec(0)
