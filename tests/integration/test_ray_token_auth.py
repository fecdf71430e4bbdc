"""A run's embedded Ray cluster is closed to clients without its token: a run started with no Ray settings at
all (no ``RAY_AUTH_MODE``, no token, a home without ``~/.ray/auth_token``) gets token auth and a random token of
its own; a process it starts (as ``kfp.local`` starts the pipeline's tasks) inherits the token and joins; a
client with no token, or with a wrong one, is refused at once with one line saying what to set, and one given
the token joins and calls the run's actor. The token appears in no output and in no log of the Ray session.

30-60 s on the 2-core machine, by its load (a Ray cluster and four client processes, each importing Ray): slow."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "auth-test"

# A client: join the cluster at argv[1] as dockflow does (connect), then call the run's actor.
CLIENT = f"""
import sys
import ray
from dockflow.config import RayConfig
from dockflow.workers.cluster import ClusterError, connect
try:
    connect(RayConfig(address=sys.argv[1], head_timeout_s=30), {NAMESPACE!r})
except ClusterError as exc:
    print("REFUSED", exc)
else:
    print("JOINED", ray.get(ray.get_actor("box").ping.remote(), timeout=60))
"""

# The run: a local cluster as `dockflow train` starts it, an actor, a child process that joins; then it waits
# for the test to close its stdin. It hands its token to the test in a file (for the leak check only).
RUN = f"""
import os, subprocess, sys
from pathlib import Path
import ray
from dockflow.config import RayConfig
from dockflow.workers.cluster import connect, joined_address

connect(RayConfig(num_cpus=1), {NAMESPACE!r})

@ray.remote(num_cpus=0)
class Box:
    def ping(self):
        return "pong"

box = Box.options(name="box").remote()
ray.get(box.ping.remote(), timeout=120)
out = Path(sys.argv[1])
(out / "token").write_text(os.environ["RAY_AUTH_TOKEN"])
child = subprocess.run([sys.executable, "-c", {CLIENT!r}, joined_address()], capture_output=True, text=True,
                       timeout=180)
(out / "child").write_text(child.stdout + child.stderr)
(out / "session").write_text(ray._private.worker._global_node.get_session_dir_path())
(out / "address").write_text(joined_address())
sys.stdin.read()
"""


def bare_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment without any Ray auth setting, with an empty home (no ~/.ray/auth_token)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return {**env, "HOME": str(home), "PYTHONPATH": str(REPO), **extra}


def wait_for(path: Path, run: subprocess.Popen, log: Path, timeout_s: float = 240) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert run.poll() is None, f"the run exited:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {path.name} from the run in {timeout_s}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)
    return path.read_text()


def test_only_clients_with_the_runs_token_join_its_local_cluster(tmp_path: Path) -> None:
    home, out = tmp_path / "home", tmp_path / "out"
    home.mkdir()
    out.mkdir()
    log = tmp_path / "run.log"
    with log.open("w") as sink:
        run = subprocess.Popen([sys.executable, "-c", RUN, str(out)], cwd=REPO, env=bare_env(home),
                               stdin=subprocess.PIPE, stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        address = wait_for(out / "address", run, log)
        token = (out / "token").read_text()
        assert len(token) == 64
        clients = {name: subprocess.Popen([sys.executable, "-c", CLIENT, address], cwd=REPO, env=bare_env(home, **env),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for name, env in (("none", {}), ("wrong", {"RAY_AUTH_TOKEN": "0" * 64}),
                                     ("given", {"RAY_AUTH_TOKEN": token}))}
        said = {name: c.communicate(timeout=180)[0] for name, c in clients.items()}
        refused = {name: next((line for line in text.splitlines() if line.startswith("REFUSED")), text)
                   for name, text in said.items()}
        assert refused["none"].startswith(f"REFUSED the Ray cluster at ray.address={address!r} requires a token"), said
        assert "set RAY_AUTH_TOKEN to the cluster's token" in refused["none"]
        assert refused["wrong"].startswith(f"REFUSED the Ray cluster at ray.address={address!r} refused the token "
                                           "from RAY_AUTH_TOKEN"), said
        assert "JOINED pong" in said["given"], said["given"][-2000:]
        assert "JOINED pong" in (out / "child").read_text()  # the run's own child processes inherit the token
        run.stdin.close()
        run.wait(timeout=120)
        logs = [log, *Path((out / "session").read_text(), "logs").rglob("*")]
        leaked = [p for p in logs if p.is_file() and token in p.read_text(errors="replace")]
        assert not leaked and all(token not in text for text in said.values()), leaked
        assert not (home / ".ray" / "auth_token").exists()  # Ray made no token file of its own
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=60)
