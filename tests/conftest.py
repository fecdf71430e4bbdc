"""Test-wide settings: the local Ray cluster runs without auth or usage stats, tokenizers single-threaded;
the S3 and MLflow test server fixtures (``tests/fixtures/s3_server.py``, ``tests/fixtures/mlflow_server.py``)."""

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

# Test server fixtures: mlflow_server (an MLflow tracking server, session-scoped, started on first use);
# s3_server, s3_env, s3_checkpoint_dir (moto is imported only when one is used).
from fixtures.mlflow_server import mlflow_server  # noqa: E402, F401
from fixtures.s3_server import s3_checkpoint_dir, s3_env, s3_server  # noqa: E402, F401
