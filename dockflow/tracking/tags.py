"""The tags every DockFlow MLflow run carries, so runs can be told apart and compared (``dockflow compare``).

    tags = run_tags(cfg.algorithm.name, cfg.model.path, cfg.dock.backend, cfg.run.name)
    Tracker.start(cfg.tracking, run_dir, cfg.run.name, params=cfg.flat(), tags=tags)
    tracker.set_tags(identity_tags(ident.fingerprint, ident.fields(), task, base_model))   # at the run's end

The identity tags (``dockflow.eval.*``, ``dockflow.lineage.*``) also go on the run's registered version: the
champion gate (``dockflow.tracking.champion``) reads them.
"""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

TAG_KEYS = ("algorithm", "model", "dock_backend", "git_commit", "dockflow_version")

EVAL_TAG_PREFIX = "dockflow.eval."
FINGERPRINT_TAG = "dockflow.eval.fingerprint"  # the identity of the evaluation a run's scores come from
TASK_TAG = "dockflow.lineage.task"
BASE_MODEL_TAG = "dockflow.lineage.base_model"
IDENTITY_KEYS = (FINGERPRINT_TAG, TASK_TAG, BASE_MODEL_TAG)
FIELD_CHARS = 500


def _clip(text: str) -> str:
    return text if len(text) <= FIELD_CHARS else text[: FIELD_CHARS - 1] + "…"


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


def identity_tags(fingerprint: str, fields: dict[str, str], task: str, base_model: str) -> dict[str, str]:
    """The tags a run and its registered version carry: the evaluation's fingerprint and each of its ``fields``
    (``dockflow.eval.<field>``), and the lineage (``dockflow.lineage.task``,
    ``dockflow.lineage.base_model``). Values are cut to ``FIELD_CHARS``: a long system prompt must not exceed
    MLflow's limit on a tag value (the fingerprint hashes the whole)."""
    tags = {f"{EVAL_TAG_PREFIX}{k}": _clip(v) for k, v in fields.items()}
    tags |= {FINGERPRINT_TAG: fingerprint, TASK_TAG: _clip(task), BASE_MODEL_TAG: _clip(base_model)}
    return tags


def run_tags(algorithm: str, model_path: str | None, dock_backend: str, run_name: str) -> dict[str, str]:
    """algorithm, model (``model_path`` or "tiny-qwen2"), dock_backend, git_commit, dockflow_version and
    mlflow.runName (``run_name``)."""
    return {
        "algorithm": algorithm,
        "model": model_path or "tiny-qwen2",
        "dock_backend": dock_backend,
        "git_commit": git_commit(),
        "dockflow_version": dockflow_version(),
        "mlflow.runName": run_name,
    }
