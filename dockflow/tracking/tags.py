"""The tags every DockFlow MLflow run carries, so runs can be told apart and compared (``dockflow compare``).

    Tracker.start(cfg.tracking, run_dir, cfg.run.name, params=cfg.flat(), tags=run_tags(cfg))
"""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

from dockflow.config import Config

TAG_KEYS = ("algorithm", "model", "dock_backend", "git_commit", "dockflow_version")


def git_commit(path: str | Path | None = None) -> str:
    """``git rev-parse HEAD`` of the repository holding ``path`` (default: this package), else "unknown"."""
    where = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = out.stdout.strip()
    return commit if commit else "unknown"


def dockflow_version() -> str:
    """The installed dockflow distribution's version, else "unknown"."""
    try:
        return metadata.version("dockflow")
    except metadata.PackageNotFoundError:
        return "unknown"


def run_tags(cfg: Config) -> dict[str, str]:
    """algorithm, model (path or "tiny-qwen2"), dock_backend, git_commit, dockflow_version and mlflow.runName."""
    return {
        "algorithm": cfg.algorithm.name,
        "model": cfg.model.path or "tiny-qwen2",
        "dock_backend": cfg.dock.backend,
        "git_commit": git_commit(),
        "dockflow_version": dockflow_version(),
        "mlflow.runName": cfg.run.name,
    }
