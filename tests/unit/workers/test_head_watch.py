"""The driver's watch on a joined Ray head (``dockflow.workers.cluster``): the address forms it watches, and one
call of ``on_lost`` once the head's port stays closed for the timeout, none while it answers."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from dockflow.workers.cluster import ClusterError, HeadWatch, head_endpoint, probe_head


@pytest.mark.parametrize(("address", "endpoint"), [
    ("127.0.0.1:6379", ("127.0.0.1", 6379)), ("ray://head.svc:10001", ("head.svc", 10001)), ("auto", None),
])
def test_the_address_forms_it_watches(address: str, endpoint: tuple[str, int] | None) -> None:
    assert head_endpoint(address) == endpoint


def test_a_head_that_goes_away_is_reported_once_after_the_timeout() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{server.getsockname()[1]}"
    lost: list[tuple[float, str]] = []
    called = threading.Event()
    watch = HeadWatch(address, 0.5, lambda m: (lost.append((time.monotonic(), m)), called.set()), interval_s=0.05)
    time.sleep(0.4)
    assert lost == []  # it answers
    closed = time.monotonic()
    server.close()
    assert called.wait(timeout=10)
    time.sleep(0.3)
    watch.stop()
    assert len(lost) == 1 and 0.5 <= lost[0][0] - closed < 5, lost
    assert lost[0][1].startswith(f"lost the Ray head at {address} (unreachable for ")


def test_joining_a_head_that_is_not_there_fails_in_the_timeout() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(ClusterError, match=rf"^no Ray head answers at ray.address='127.0.0.1:{port}' \(waited 1s"):
        probe_head(f"127.0.0.1:{port}", 1.0)
    assert time.monotonic() - start < 5
