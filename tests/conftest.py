"""Test-wide settings: the local Ray clusters run with token auth (one random token for the whole session, so
the clusters and heads the tests start and every client they start accept each other) and without usage stats,
tokenizers single-threaded; the S3 and MLflow test server fixtures (``tests/fixtures/s3_server.py``,
``tests/fixtures/mlflow_server.py``)."""

import os
import secrets

os.environ.setdefault("RAY_AUTH_MODE", "token")
if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)  # never ~/.ray/auth_token: the tests leave no file behind
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

# Test server fixtures: mlflow_server (an MLflow tracking server, session-scoped, started on first use);
# s3_server, s3_env, s3_checkpoint_dir (moto is imported only when one is used).
from fixtures.mlflow_server import mlflow_server, mlflow_server_process  # noqa: E402, F401
from fixtures.s3_server import s3_checkpoint_dir, s3_env, s3_server  # noqa: E402, F401

# The longest test files (minutes each, measured 2026-11-28): collected first, so that two pytest-xdist workers
# (``--dist loadfile``) start them at once instead of ending on one of them.
LONGEST_FIRST = ("tests/integration/test_pipeline_local.py", "tests/integration/test_algorithms.py",
                 "tests/integration/test_outages.py", "tests/integration/test_reward_functions_run.py")


def _weight(item) -> int:
    path = item.nodeid.split("::")[0]
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items):
    """The longest files first (``LONGEST_FIRST``); tests marked ``vllm_in_process`` run last. They start vLLM's CPU engine in the test process, which replaces
    ``torch.set_num_threads`` with a no-op and binds OpenMP threads: a process forked from it after that inherits
    a pool it cannot shrink and hangs or crashes (the gloo tests' ranks start from a fork server instead,
    ``fixtures/ranks.py``; the tool sandbox forks). DockFlow's workers never fork after vLLM
    starts; the test process does, so the order is fixed here. ``make test`` passes xdist ``--no-loadscope-reorder``:
    without it the loadfile scheduler re-sorts the files by their number of tests and this order is lost. (The tool
    children of ``test_vllm_tools.py`` fork after vLLM started: pure Python, no OpenMP, which is safe.)"""
    items.sort(key=_weight)  # stable: the others keep their order
    items.sort(key=lambda item: item.get_closest_marker("vllm_in_process") is not None)
