"""MLflow Model Registry for recurring runs: register the final model, fetch a start.

    version = register_final_model(uri, cfg.registry, run_id, final_model_dir, score, tags=identity)
    start = fetch_registered_model(uri, cfg.registry, "champion", work_dir)   # start.local_dir: HF dir
    other = fetch_model_version(uri, cfg.registry, 3, work_dir)

A finished run logs its final Hugging Face directory as artifacts of its MLflow run (under ``model/``, in the
MLflow artifact store, which checkpoint retention never touches) and registers them as a new version of
``registry.model_name``, tagged with its held-out score (``dockflow.score``), the metric's name
(``dockflow.score_metric``) and the identity of the evaluation and lineage it comes from (``dockflow.eval.*``,
``dockflow.lineage.*``: ``dockflow.tracking.tags``). Whether it takes the champion alias is the gate's
decision (``dockflow.tracking.champion``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import mlflow.artifacts
from mlflow.entities.model_registry import ModelVersion, RegisteredModel
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from dockflow.config import RegistryConfig
from dockflow.tracking.registry_client import (
    RegistryError,
    RegistryLockTimeout,
    call,
    ensure_registered_model,
    filter_by_name,
    is_missing,
    open_client,
    retry_transient,
)
from dockflow.tracking.store import explain

__all__ = [
    "FetchedModel",
    "RegistryError",
    "RegistryLockTimeout",
    "fetch_model_version",
    "fetch_registered_model",
    "lock_model_name",
    "model_version_tags",
    "register_final_model",
]

MODEL_ARTIFACT_PATH = "model"
SCORE_TAG = "dockflow.score"
METRIC_TAG = "dockflow.score_metric"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FetchedModel:
    """A registered version downloaded to local disk."""

    name: str
    version: int
    run_id: str | None
    score: float | None  # the version's ``dockflow.score`` tag; None when absent
    local_dir: Path  # the downloaded Hugging Face directory
    source: str  # where MLflow keeps it
    tags: dict[str, str] = field(default_factory=dict)  # the version's tags (its identity, its score)


def registered_name(cfg: RegistryConfig) -> str:
    if not cfg.model_name:
        raise RegistryError("registry.model_name is null: set it to the registered model that runs build on")
    filter_by_name(cfg.model_name)  # rejects a name no search filter can quote
    return cfg.model_name


def lock_model_name(cfg: RegistryConfig) -> str:
    """The registered model that holds the champion lock's tickets."""
    return f"{registered_name(cfg)}.{cfg.champion_alias}.lock"


def parse_score(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _version_of_run(client: MlflowClient, name: str, run_id: str) -> int | None:
    """The version of ``name`` that run ``run_id`` registered, if any (None also when the model is missing)."""
    try:
        found = client.search_model_versions(f"{filter_by_name(name)} and run_id='{run_id}'", max_results=1)
    except MlflowException as exc:
        if is_missing(exc):
            return None
        raise
    return int(found[0].version) if found else None


def register_final_model(
    tracking_uri: str,
    cfg: RegistryConfig,
    run_id: str,
    model_dir: str | Path,
    score: float,
    *,
    tags: Mapping[str, str] | None = None,
) -> int:
    """Log ``model_dir`` (a Hugging Face directory) under ``model/`` of run ``run_id`` and register it as a new
    version of ``cfg.model_name`` (created if missing), tagged with ``score`` and ``tags`` (the identity tags of
    ``dockflow.tracking.tags.identity_tags``). Returns the version number.
    A run registers one version: when ``run_id`` already has one (a retried task), that one is returned.

    Raises RegistryError when the name is null, the directory is not a model, the run does not exist, or
    MLflow fails."""
    name = registered_name(cfg)
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise RegistryError(
            f"final model {model_dir} is not a Hugging Face directory (no config.json): save the model before "
            f"registering it in '{name}'"
        )
    client = open_client(tracking_uri)
    try:
        run = client.get_run(run_id)
    except Exception as exc:
        if is_missing(exc) or (isinstance(exc, MlflowException) and exc.error_code == "INVALID_PARAMETER_VALUE"):
            raise RegistryError(
                f"MLflow run {run_id} does not exist at {tracking_uri}: register with the run id of this run's "
                "tracker and the same tracking.uri"
            ) from None
        raise RegistryError(f"reading run {run_id}: {explain(tracking_uri, exc)}") from exc
    where = f"registering {model_dir} as a version of '{name}'"
    existing = call(tracking_uri, where, lambda: _version_of_run(client, name, run_id))
    if existing is not None:  # a retried task: one run registers one version
        log.info("run %s already registered version %s of '%s'; not registering again", run_id, existing, name)
        return existing
    call(tracking_uri, where, lambda: client.log_artifacts(run_id, str(model_dir), MODEL_ARTIFACT_PATH))
    source = f"{run.info.artifact_uri.rstrip('/')}/{MODEL_ARTIFACT_PATH}"
    description = f"DockFlow models; versions are ranked by {cfg.score_metric} (higher is better)."
    call(tracking_uri, where, lambda: ensure_registered_model(client, name, description, {}))
    score = float(score)
    version_tags = {**(tags or {}), SCORE_TAG: repr(score), METRIC_TAG: cfg.score_metric}
    mv = call(
        tracking_uri,
        where,
        lambda: retry_transient(
            lambda: client.create_model_version(
                name, source, run_id=run_id, tags=version_tags, description=f"{cfg.score_metric}={score:.6g}"
            )
        ),
    )
    return int(mv.version)


def _registered_model(client: MlflowClient, uri: str, name: str, need: str) -> RegisteredModel:
    try:
        return client.get_registered_model(name)
    except Exception as exc:
        if is_missing(exc):
            raise RegistryError(
                f"registered model '{name}' does not exist at {uri} ({need}): run once with "
                f"model.continue_from: base and registry.model_name: {name} first, or fix registry.model_name "
                "or tracking.uri"
            ) from None
        raise RegistryError(f"reading registered model '{name}': {explain(uri, exc)}") from exc


def _latest_version(client: MlflowClient, name: str) -> ModelVersion | None:
    found = client.search_model_versions(filter_by_name(name), max_results=1, order_by=["version_number DESC"])
    return found[0] if found else None


def _download(client: MlflowClient, uri: str, mv: ModelVersion, dest_dir: Path) -> Path:
    """Download version ``mv`` into ``dest_dir/<name>-v<version>`` (replacing an older copy)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / f"{mv.name.replace(os.sep, '_')}-v{mv.version}"
    source = client.get_model_version_download_uri(mv.name, mv.version)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=dest_dir))
    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(tmp), tracking_uri=uri))
        if not (local / "config.json").is_file():
            raise RegistryError(
                f"version {mv.version} of '{mv.name}' at {uri} is not a Hugging Face directory (no config.json "
                f"at {source}): register a final model directory, or use another version"
            )
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(local, target)
        except OSError:
            if not (target / "config.json").is_file():  # else a concurrent fetch of this version renamed first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def fetch_registered_model(
    tracking_uri: str, cfg: RegistryConfig, which: Literal["latest", "champion"], dest_dir: str | Path
) -> FetchedModel:
    """Download the newest version (``latest``) or the version holding ``cfg.champion_alias`` (``champion``)
    of ``cfg.model_name`` into ``dest_dir/<name>-v<version>`` (an older copy there is replaced).

    Raises RegistryError when the model does not exist, has no versions or no champion alias, or MLflow fails;
    ValueError for another ``which``."""
    if which not in ("latest", "champion"):
        raise ValueError(f"which must be 'latest' or 'champion', got {which!r}")
    name, alias = registered_name(cfg), cfg.champion_alias
    client = open_client(tracking_uri)
    need = f"model.continue_from: {which}"
    rm = _registered_model(client, tracking_uri, name, need)
    where = f"fetching the {which} version of '{name}'"
    if which == "latest":
        mv = call(tracking_uri, where, lambda: _latest_version(client, name))
        if mv is None:
            raise RegistryError(
                f"registered model '{name}' at {tracking_uri} has no versions ({need}): run once with "
                "model.continue_from: base first, so that a finished run registers one"
            )
    else:
        version = rm.aliases.get(alias)
        if version is None:
            raise RegistryError(
                f"registered model '{name}' at {tracking_uri} has no '{alias}' alias ({need}): run once with "
                f"model.continue_from: base first (a finished run with a finite {cfg.score_metric} takes the alias "
                "when none holds it), use model.continue_from: latest, or set the alias by hand"
            )
        mv = call(tracking_uri, where, lambda: client.get_model_version(name, str(version)))
    return _fetched(client, tracking_uri, mv, Path(dest_dir), where)


def fetch_model_version(tracking_uri: str, cfg: RegistryConfig, version: int, dest_dir: str | Path) -> FetchedModel:
    """Download version ``version`` of ``cfg.model_name`` into ``dest_dir/<name>-v<version>`` (the champion gate
    re-scores a champion from it). Raises RegistryError when the version does not exist or MLflow fails."""
    client = open_client(tracking_uri)
    mv = _get_version(client, tracking_uri, registered_name(cfg), version)
    return _fetched(client, tracking_uri, mv, Path(dest_dir), f"fetching version {version} of '{mv.name}'")


def model_version_tags(tracking_uri: str, cfg: RegistryConfig, version: int) -> dict[str, str]:
    """The tags of version ``version`` of ``cfg.model_name`` (a run that started from it reads its lineage).
    Raises RegistryError when the version does not exist or MLflow fails."""
    return dict(_get_version(open_client(tracking_uri), tracking_uri, registered_name(cfg), version).tags)


def _get_version(client: MlflowClient, uri: str, name: str, version: int) -> ModelVersion:
    try:
        return client.get_model_version(name, str(int(version)))
    except Exception as exc:
        if is_missing(exc):
            raise RegistryError(f"version {version} of registered model '{name}' does not exist at {uri}") from None
        raise RegistryError(f"reading version {version} of '{name}': {explain(uri, exc)}") from exc


def _fetched(client: MlflowClient, uri: str, mv: ModelVersion, dest_dir: Path, where: str) -> FetchedModel:
    path = call(uri, where, lambda: _download(client, uri, mv, dest_dir))
    return FetchedModel(
        name=mv.name, version=int(mv.version), run_id=mv.run_id or None, score=parse_score(mv.tags.get(SCORE_TAG)),
        local_dir=path, source=mv.source, tags=dict(mv.tags),
    )  # fmt: skip
