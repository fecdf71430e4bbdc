"""The code sandbox against hand-written hostile programs: each ends as it should and the host is untouched."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from dockflow.rewards import sandbox
from dockflow.rewards.sandbox import SandboxLimits, run_sandboxed

FAST = SandboxLimits(timeout_s=3.0, cpu_s=3, memory_mb=512, nproc=16, fsize_mb=4, disk_mb=16)
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="uid drop and namespaces need root")


@pytest.fixture(autouse=True)
def _host_untouched():
    """Every test: no sandbox dir left in the temp dir and the host's mounts unchanged."""
    tmp = tempfile.gettempdir()
    before = {d for d in os.listdir(tmp) if d.startswith("dockflow-sandbox-")}
    with open("/proc/self/mountinfo") as f:
        mounts = f.read()
    yield
    assert {d for d in os.listdir(tmp) if d.startswith("dockflow-sandbox-")} <= before
    with open("/proc/self/mountinfo") as f:
        assert f.read() == mounts


def test_correct_program_passes():
    r = run_sandboxed("print(sum(range(10)))", FAST)
    assert (r.status, r.returncode, r.stdout, r.error) == ("passed", 0, "45\n", None)
    assert r.wall_s < FAST.timeout_s


def test_wrong_program_fails_with_its_exit_code():
    r = run_sandboxed("import sys\nassert 1 + 1 == 3, 'math'\n", FAST)
    assert (r.status, r.returncode) == ("failed", 1)
    assert "AssertionError: math" in r.stderr
    assert run_sandboxed("raise SystemExit(7)", FAST).returncode == 7


def test_syntax_error_fails():
    r = run_sandboxed("def f(:\n    return 1\n", FAST)
    assert (r.status, r.returncode) == ("failed", 1)
    assert "SyntaxError" in r.stderr


def test_stdin_is_given_and_then_empty():
    r = run_sandboxed("import sys\nprint(sys.stdin.readline().strip()[::-1])\nprint(repr(sys.stdin.read()))", FAST,
                      stdin=b"abc\n")
    assert r.stdout == "cba\n''\n"


def test_infinite_loop_hits_the_wall_clock_timeout():
    r = run_sandboxed("while True:\n    pass\n", SandboxLimits(timeout_s=1.0, cpu_s=30))
    assert (r.status, r.returncode) == ("timeout", None)
    assert 1.0 <= r.wall_s < 3.0


def test_cpu_limit_kills_a_busy_program():
    r = run_sandboxed("while True:\n    pass\n", SandboxLimits(timeout_s=10.0, cpu_s=1))
    assert (r.status, r.signal) == ("killed", signal.SIGXCPU)


def test_sleeping_program_is_killed_at_the_timeout():
    r = run_sandboxed("import time\ntime.sleep(60)\n", SandboxLimits(timeout_s=1.0))
    assert r.status == "timeout" and r.wall_s < 3.0


def test_memory_bomb_fails():
    r = run_sandboxed("x = bytearray(8 << 30)\nprint('allocated')\n", FAST)
    assert (r.status, r.stdout) == ("failed", "")
    assert "MemoryError" in r.stderr
    grow = "chunks = []\nwhile True:\n    chunks.append(bytearray(64 << 20))\n"
    r = run_sandboxed(grow, FAST)
    assert r.status == "failed" and "MemoryError" in r.stderr


def test_file_size_limit_and_output_tail():
    r = run_sandboxed("open('big', 'wb').write(b'x' * (8 << 20))", FAST)  # fsize_mb=4
    assert r.status == "failed" and "File too large" in r.stderr
    r = run_sandboxed("print('a' * 100000)\nprint('end')", SandboxLimits(timeout_s=3.0, output_bytes=1000))
    assert r.status == "passed" and len(r.stdout) == 1000 and r.stdout.endswith("end\n")


def test_environment_is_clean(monkeypatch):
    secret = secrets.token_hex(8)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("PYTHONPATH", "/nonexistent-" + secret)
    r = run_sandboxed("import os, sys\nprint(dict(os.environ))\nprint(sys.path)\n", FAST)
    assert r.status == "passed"
    assert secret not in r.stdout + r.stderr
    assert "AWS_" not in r.stdout


@root_only
def test_parent_environ_is_unreadable(monkeypatch):
    secret = secrets.token_hex(8)
    monkeypatch.setenv("DOCKFLOW_SANDBOX_TEST_SECRET", secret)
    code = (
        "import os\n"
        f"for pid in (os.getppid(), 1, {os.getpid()}, {os.getppid()}):\n"
        "    try:\n"
        "        print(pid, open(f'/proc/{pid}/environ').read())\n"
        "    except OSError as e:\n"
        "        print(pid, 'denied', e)\n"
    )
    r = run_sandboxed(code, FAST)
    assert r.status == "passed" and "denied" in r.stdout
    assert secret not in r.stdout + r.stderr


@root_only
def test_runs_as_an_unused_uid_without_privileges():
    code = "import os\nprint(os.getuid(), os.getgid(), os.getgroups())\nos.setuid(0)\n"
    r = run_sandboxed(code, FAST)
    assert r.uid is not None and sandbox.UID_BASE <= r.uid < sandbox.UID_BASE + sandbox.UID_SPAN
    assert r.stdout == f"{r.uid} {r.uid} []\n"
    assert r.status == "failed" and "PermissionError" in r.stderr
    assert r.isolation["uid_drop"]


@root_only
def test_writing_outside_its_directory_fails():
    name = "dockflow-sbx-" + secrets.token_hex(6)
    targets = [f"/tmp/{name}", f"/var/tmp/{name}", f"/dev/shm/{name}", f"/etc/{name}", f"/{name}"]
    code = (
        "import os\n"
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        print('wrote', path)\n"
        "    except OSError as e:\n"
        "        print('refused', path, e.errno)\n"
        "open('own.txt', 'w').write('ok')\n"
        "print('own', open(os.path.join(os.getcwd(), 'own.txt')).read())\n"
    )
    try:
        r = run_sandboxed(code, FAST)
        assert r.status == "passed" and "own ok" in r.stdout
        leaked = [t for t in targets if os.path.exists(t)]
        assert leaked == []
        if not r.isolation["private_tmp"]:  # without a mount namespace only root's own dirs are refused
            assert f"refused /etc/{name}" in r.stdout
    finally:
        for t in targets:
            if os.path.exists(t):
                os.remove(t)


@root_only
def test_socket_to_the_host_fails():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "s.sendall(b'hello')\nprint('connected')\n"
    )
    try:
        r = run_sandboxed(code, FAST)
        if not r.isolation.get("netns"):
            pytest.skip("no network namespace on this platform: the sandbox cannot cut the network")
        assert r.status == "failed" and "connected" not in r.stdout
        assert "Network is unreachable" in r.stderr
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


@root_only
def test_fork_bomb_stays_inside_the_uid_limit_and_is_cleaned_up():
    # Children escape the process group (setsid) and would sleep on; the parent reports how many it got.
    count = (
        "import os, time\nn = 0\n"
        "for _ in range(200):\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        os.setsid()\n        time.sleep(60)\n        os._exit(0)\n"
        "    n += 1\n"
        "print(n)\n"
    )
    r = run_sandboxed(count, FAST)
    assert r.status == "passed"
    assert 0 < int(r.stdout) < FAST.nproc
    assert sandbox._uid_pids(r.uid) == []
    bomb = (
        "import os, time\n"
        "while True:\n"
        "    try:\n        if os.fork() == 0:\n            os.setsid()\n"
        "    except OSError:\n        time.sleep(0.05)\n"
    )
    r = run_sandboxed(bomb, SandboxLimits(timeout_s=1.0, cpu_s=5, nproc=16))
    assert r.status == "timeout"
    assert sandbox._uid_pids(r.uid) == []
    assert run_sandboxed("print('after')", FAST).stdout == "after\n"


@root_only
def test_concurrent_runs_get_their_own_uids():
    code = "import time\ntime.sleep(0.5)\nprint('done')\n"
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: run_sandboxed(code, FAST), range(2)))
    assert [(r.status, r.stdout) for r in results] == [("passed", "done\n")] * 2
    assert results[0].uid != results[1].uid
    assert sandbox._claimed_uids == set()


def test_without_root_it_still_runs_with_limits(monkeypatch):
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 12345)  # take the not-root path
    r = run_sandboxed("import os\nprint(os.getcwd(), flush=True)\nwhile True:\n    pass\n", SandboxLimits(timeout_s=1.0))
    assert r.status == "timeout" and r.uid is None
    assert not any(r.isolation.values())
    assert "dockflow-sandbox-" in r.stdout
    r = run_sandboxed("x = bytearray(8 << 30)", FAST)
    assert r.status == "failed" and "MemoryError" in r.stderr


def test_missing_interpreter_is_a_setup_error():
    r = run_sandboxed("print(1)", FAST, python="/nonexistent/bin/python3")
    assert r.status == "error" and "cannot exec /nonexistent/bin/python3" in (r.error or "")
