"""run_tags: what tells runs apart; the git commit never fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dockflow.config import Config
from dockflow.tracking import run_tags
from dockflow.tracking.tags import (
    BASE_MODEL_TAG,
    FIELD_CHARS,
    FINGERPRINT_TAG,
    TASK_TAG,
    git_commit,
    identity_tags,
)

ROOT = Path(__file__).resolve().parents[3]


def test_run_tags_name_algorithm_model_backend_commit_version() -> None:
    cfg = Config.model_validate({"run": {"name": "exp1"}, "dock": {"backend": "centralized"}})
    tags = run_tags(cfg.algorithm.name, cfg.model.path, cfg.dock.backend, cfg.run.name)
    assert set(tags) == {"algorithm", "model", "dock_backend", "git_commit", "dockflow_version", "mlflow.runName"}
    assert tags["algorithm"] == "grpo" and tags["model"] == "tiny-qwen2" and tags["dock_backend"] == "centralized"
    assert tags["mlflow.runName"] == "exp1"
    assert tags["dockflow_version"] not in ("", None)
    assert tags["git_commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}", tags["git_commit"])
    assert run_tags("grpo", "/models/qwen2.5-0.5b", "distributed", "exp1")["model"] == "/models/qwen2.5-0.5b"


def test_git_commit_is_unknown_outside_a_repo_or_without_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if (ROOT / ".git").exists():
        assert re.fullmatch(r"[0-9a-f]{40}", git_commit(ROOT))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # do not find a repo above tmp_path
    assert git_commit(tmp_path) == "unknown"
    assert git_commit(tmp_path / "missing") == "unknown"
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable at all
    assert git_commit(ROOT) == "unknown"


def test_identity_tags_name_the_evaluation_and_lineage_within_mlflows_limits() -> None:
    tags = identity_tags("0123456789abcdef", {"num_prompts": "500", "system_prompt": "x" * 9000}, "arithmetic", "tiny")
    assert tags[FINGERPRINT_TAG] == "0123456789abcdef" and tags["dockflow.eval.num_prompts"] == "500"
    assert (tags[TASK_TAG], tags[BASE_MODEL_TAG]) == ("arithmetic", "tiny")
    assert len(tags["dockflow.eval.system_prompt"]) == FIELD_CHARS and tags["dockflow.eval.system_prompt"].endswith("…")
