"""Run untrusted Python in a child process under OS limits (what it isolates: docs/sandbox.md).

    result = run_sandboxed("print(1 + 1)", SandboxLimits(timeout_s=2))
    result.status, result.stdout        # ('passed', '2\\n')

As root each run gets its own unused uid/gid, new network, mount, pid and IPC namespaces, a private
tmpfs as /tmp (its working directory) and rlimits; the uid's processes are all killed at the end.
Not root: rlimits, a clean environment and a process group only. This is not a security boundary.
This file is also the launcher (``python -I -S sandbox.py CONFIG``, so namespaces and the uid drop
happen in a fresh single-threaded process): standard library imports only.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pwd
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

UID_BASE = 1_500_000_000  # sandbox uids are drawn from [UID_BASE, UID_BASE + UID_SPAN)
UID_SPAN = 100_000_000
_CLONE = {"netns": 0x40000000, "ipcns": 0x08000000, "mntns": 0x00020000, "pidns": 0x20000000}
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_REC, _MS_PRIVATE, _MNT_DETACH = 4096, 16384, 1 << 18, 2
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_SHARED_TMP_DIRS = ("/var/tmp", "/dev/shm", "/run/lock")  # world-writable dirs hidden when namespaced
_Mount = Callable[..., None]
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}

_uid_lock = threading.Lock()
_claimed_uids: set[int] = set()


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. CPU, memory, file size, process and file counts are rlimits of the program."""

    timeout_s: float = 10.0  # wall clock for the whole run; then the process tree is killed
    cpu_s: int = 10  # RLIMIT_CPU: SIGXCPU at this many CPU seconds, SIGKILL one second later
    memory_mb: int = 1024  # RLIMIT_AS (address space, so thread stacks count too)
    fsize_mb: int = 16  # RLIMIT_FSIZE: largest file it may write, stdout/stderr included
    disk_mb: int = 64  # size of the private /tmp (namespaced runs only)
    nproc: int = 32  # RLIMIT_NPROC: processes + threads of the sandbox uid
    nofile: int = 64  # RLIMIT_NOFILE
    output_bytes: int = 16384  # tail of stdout / stderr kept in the result


@dataclass(frozen=True)
class SandboxResult:
    """status: passed (exit 0) | failed (exit != 0) | timeout | killed (by a signal) | error (setup)."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    signal: int | None = None
    uid: int | None = None  # the dropped-to uid, None when not root
    isolation: Mapping[str, bool] = field(default_factory=dict)
    error: str | None = None


def run_sandboxed(
    code: str,
    limits: SandboxLimits | None = None,
    *,
    stdin: bytes = b"",
    python: str | None = None,
    site_packages: bool = False,
) -> SandboxResult:
    """Run ``code`` as a Python script in the sandbox and return how it ended; never raises for the code.

    python: the interpreter for the program (default: this one); site_packages: let it import the
    interpreter's installed packages (``-S`` is dropped), otherwise only the standard library.
    """
    limits = limits or SandboxLimits()
    uid = _claim_uid() if os.geteuid() == 0 else None
    host = tempfile.mkdtemp(prefix="dockflow-sandbox-")
    try:
        cfg = _prepare(host, code, stdin, limits, uid, python or sys.executable, site_packages)
        return _execute(host, cfg, limits)
    finally:
        if uid is not None:
            _kill_uid(uid)
            with _uid_lock:
                _claimed_uids.discard(uid)
        shutil.rmtree(host, ignore_errors=True)


def _prepare(
    host: str, code: str, stdin: bytes, limits: SandboxLimits, uid: int | None, python: str, site: bool
) -> dict:
    """Write the program (work/main.py) and stdin, and build the launcher's config."""
    os.chmod(host, 0o711)  # the dropped uid may pass through to work/, but not list or read the rest
    work = os.path.join(host, "work")
    os.mkdir(work, 0o700)
    with open(os.path.join(work, "main.py"), "w", encoding="utf-8", errors="surrogatepass") as f:
        f.write(code)
    os.chmod(os.path.join(work, "main.py"), 0o644)
    if uid is not None:
        os.chown(work, uid, uid)
    with open(os.path.join(host, "stdin"), "wb") as f:
        f.write(stdin)
    # Not root: RLIMIT_NPROC counts all of this user's processes, so it is set on top of those.
    nproc = limits.nproc if uid is not None else len(_uid_pids(os.getuid())) + limits.nproc
    mem, fsize = limits.memory_mb << 20, limits.fsize_mb << 20
    rlimits = [
        (resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 1),
        (resource.RLIMIT_AS, mem, mem),
        (resource.RLIMIT_FSIZE, fsize, fsize),
        (resource.RLIMIT_NPROC, nproc, nproc),
        (resource.RLIMIT_NOFILE, limits.nofile, limits.nofile),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    return {
        "uid": uid,
        "work": work,
        # The standard library needs no venv: exec the real interpreter, since the private /tmp hides a venv under it.
        "argv": [python if site else os.path.realpath(python), "-I", "-B"] + ([] if site else ["-S"]),
        "rlimits": rlimits,
        "disk_mb": limits.disk_mb,
        "python_prefix": os.path.dirname(os.path.dirname(os.path.realpath(python))),
    }


def _execute(host: str, cfg: dict, limits: SandboxLimits) -> SandboxResult:
    """Start the launcher, wait up to the timeout, kill its process group, read the outcome."""
    uid = cfg["uid"]
    report_r, report_w = os.pipe()
    start, timed_out = time.monotonic(), False
    try:
        config = json.dumps(cfg | {"report_fd": report_w})
        names = (("stdin", "rb"), ("stdout", "wb"), ("stderr", "wb"))
        files = [open(os.path.join(host, n), m) for n, m in names]
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", os.path.abspath(__file__), config], cwd=host,
                env=dict(_ENV), stdin=files[0], stdout=files[1], stderr=files[2],
                start_new_session=True, pass_fds=(report_w,),
            )
        finally:
            for f in files:
                f.close()
            os.close(report_w)
        try:
            proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _killpg(proc.pid)  # the launcher is not reaped yet, so the group id is still its own
            proc.wait()
        report = _read_report(report_r)
        if not timed_out and not report.get("isolation", {}).get("pidns"):
            _killpg(proc.pid)  # stragglers in the launcher's group, with no pid namespace to end them
    finally:
        os.close(report_r)
    wall = time.monotonic() - start
    out = _tail(os.path.join(host, "stdout"), limits.output_bytes)
    err = _tail(os.path.join(host, "stderr"), limits.output_bytes)
    rc, sig = report.get("exit"), report.get("signal")
    if "error" in report:
        status = "error"
    elif timed_out:
        status, rc, sig = "timeout", None, None
    elif rc is not None:
        status = "passed" if rc == 0 else "failed"
    else:  # killed by a signal, or something took the launcher down
        status = "killed"
    iso = report.get("isolation", {})
    return SandboxResult(status, rc, out, err, wall, sig, uid, iso, report.get("error"))


def _claim_uid() -> int:
    """An unused uid: no passwd entry, no processes, not held by a concurrent run here."""
    while True:
        uid = random.randrange(UID_BASE, UID_BASE + UID_SPAN)
        with _uid_lock:
            if uid not in _claimed_uids and not _has_passwd(uid) and not _uid_pids(uid):
                _claimed_uids.add(uid)
                return uid


def _has_passwd(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _proc_uid(pid: int) -> tuple[int, str] | None:
    """(real uid, state letter) of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return int(fields["Uid"].split()[0]), fields["State"].split()[0]


def _uid_pids(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is ``uid``."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = _proc_uid(int(name))
            if info is not None and info[0] == uid and info[1] != "Z":
                pids.append(int(name))
    return pids


def _kill_uid(uid: int, deadline_s: float = 5.0) -> bool:
    """SIGKILL every process of ``uid`` (setsid escapes the group, not the uid) until none is left."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        pids = _uid_pids(uid)
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(OSError):
                fd = os.pidfd_open(pid)  # pins the process: a pid reused since the scan is never hit
                try:
                    if (_proc_uid(pid) or (None,))[0] == uid:
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                finally:
                    os.close(fd)
        time.sleep(0.01)
    return not _uid_pids(uid)


def _killpg(pgid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)


def _read_report(fd: int) -> dict:
    """Merge the launcher's JSON lines (every writer has exited, so the data is all in the pipe)."""
    os.set_blocking(fd, False)
    data, report = b"", {}
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 65536):
            data += chunk
    for line in data.decode("utf-8", "replace").splitlines():
        with contextlib.suppress(ValueError):
            report.update(json.loads(line))
    return report


def _tail(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
        return f.read(limit).decode("utf-8", "replace")


# ---- launcher: runs in its own process (python -I -S sandbox.py CONFIG), root or not ----


def _launch(cfg: dict) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = cfg["report_fd"]
    os.set_inheritable(fd, False)  # so the program's exec closes it

    def say(**kw: object) -> None:
        os.write(fd, (json.dumps(kw) + "\n").encode())

    def mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        enc = [s.encode() if s is not None else None for s in (src, dst, fstype, data)]
        if libc.mount(enc[0], enc[1], enc[2], flags, enc[3]) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {dst}: {os.strerror(err)}")

    os.umask(0o022)
    uid = cfg["uid"]
    iso = {"uid_drop": uid is not None, "private_tmp": False}
    try:
        for name, flag in _CLONE.items():
            iso[name] = uid is not None and libc.unshare(flag) == 0
        if iso["mntns"]:
            iso["private_tmp"] = _private_fs(cfg, mount, libc)
        say(isolation=iso)
    except Exception as e:  # anything here is a setup error, reported to the parent
        say(isolation=iso, error=f"sandbox setup: {type(e).__name__}: {e}")
        os._exit(125)
    cwd = "/tmp" if iso["private_tmp"] else cfg["work"]
    launcher = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            if iso["pidns"]:
                _init(cfg | {"mntns": iso["mntns"]}, cwd, libc, say, mount)
            else:
                _exec_program(cfg, cwd, libc, parent=launcher)
        except BaseException as e:
            say(error=f"sandbox setup: {type(e).__name__}: {e}")
        os._exit(125)
    _, status = os.waitpid(pid, 0)
    if not iso["pidns"]:
        say(**_decode(status))
    os._exit(0)


def _private_fs(cfg: dict, mount: _Mount, libc: ctypes.CDLL) -> bool:
    """Private /tmp (a size-capped tmpfs owned by the uid), other shared tmp dirs read-only, and
    the interpreter reachable even if it lives under a dir the uid cannot enter (e.g. /root)."""
    try:
        mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing below may propagate to the host
    except OSError:
        return False
    with open(os.path.join(cfg["work"], "main.py"), "rb") as f:
        program = f.read()
    uid = cfg["uid"]
    opts = f"size={cfg['disk_mb']}m,nr_inodes=4096,mode=0700,uid={uid},gid={uid}"
    mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, opts)
    prefix, hidden = cfg["python_prefix"], None
    parts = prefix.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        path = "/" + "/".join(parts[:i])
        if os.path.isdir(path) and not os.stat(path).st_mode & 0o001:
            hidden = path
            break
    if hidden is not None:
        stage = "/tmp/.python"
        os.mkdir(stage)
        mount(prefix, stage, None, _MS_BIND | _MS_REC)
        mount("tmpfs", hidden, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=0755")
        os.makedirs(prefix, 0o755, exist_ok=True)
        mount(stage, prefix, None, _MS_BIND | _MS_REC)
        mount(None, prefix, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
        if libc.umount2(stage.encode(), _MNT_DETACH) != 0:
            raise OSError("umount staging dir")
        os.rmdir(stage)
    for d in _SHARED_TMP_DIRS:
        if os.path.isdir(d) and os.stat(d).st_mode & 0o002:
            mount("tmpfs", d, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY, "size=4k,mode=0755")
    with open("/tmp/main.py", "wb") as f:
        f.write(program)
    return True


def _init(cfg: dict, cwd: str, libc: ctypes.CDLL, say: Callable[..., None], mount: _Mount) -> None:
    """pid 1 of the new pid namespace (still root): run the program, reap orphans, report, exit.
    Its exit makes the kernel kill everything left in the namespace."""
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if cfg["mntns"]:
        mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    me = os.getpid()
    child = os.fork()
    if child == 0:
        try:
            _exec_program(cfg, cwd, libc, parent=me)
        except BaseException as e:
            say(error=f"sandbox setup: {type(e).__name__}: {e}")
        os._exit(125)
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            say(**_decode(status))
            os._exit(0)


def _exec_program(cfg: dict, cwd: str, libc: ctypes.CDLL, parent: int) -> None:
    for res, soft, hard in cfg["rlimits"]:
        resource.setrlimit(res, (soft, hard))
    uid = cfg["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError("prctl(PR_SET_NO_NEW_PRIVS)")
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after the uid change, which clears it
    if os.getppid() != parent:
        os._exit(125)
    os.umask(0o077)
    os.chdir(cwd)
    argv, env = cfg["argv"], dict(os.environ, HOME=cwd, TMPDIR=cwd)
    try:
        os.execve(argv[0], [*argv, os.path.join(cwd, "main.py")], env)
    except OSError as e:  # typically an interpreter the dropped uid cannot read: pass python=
        raise OSError(e.errno, f"cannot exec {argv[0]} as uid {os.getuid()}: {e.strerror}") from None


def _decode(status: int) -> dict:
    return {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"exit": os.WEXITSTATUS(status)}


if __name__ == "__main__":
    _launch(json.loads(sys.argv[1]))
