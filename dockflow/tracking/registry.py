"""MLflow Model Registry for recurring runs: register the final model, move the champion alias, fetch a start.

    version = register_final_model(uri, cfg.registry, run_id, final_model_dir, score)
    decision = decide_champion(uri, cfg.registry, version, score)
    metrics, tags = decision_metrics(decision)       # log them to the run
    start = fetch_registered_model(uri, cfg.registry, "champion", work_dir)   # start.local_dir: HF dir

A finished run logs its final Hugging Face directory as artifacts of its MLflow run (under ``model/``, in the
MLflow artifact store, which checkpoint retention never touches) and registers them as a new version of
``registry.model_name``, tagged with its held-out score (``dockflow.score``) and the metric's name
(``dockflow.score_metric``). The ``champion`` alias moves to the new version only when its score is finite and
beats the champion's by more than ``registry.champion_margin`` (the first finite version always takes it).
The read of the champion's score and the alias move happen under a lock kept in MLflow's own registry
(``dockflow.tracking.registry_lock``: its docstring explains the primitive and its limits), so two runs
finishing together cannot both win against the same old champion: the second compares against the first's
result.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
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
from dockflow.tracking.registry_lock import RegistryLock
from dockflow.tracking.store import explain

__all__ = [
    "ChampionDecision",
    "FetchedModel",
    "RegistryError",
    "RegistryLockTimeout",
    "decide_champion",
    "decision_metrics",
    "fetch_registered_model",
    "lock_model_name",
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


@dataclass(frozen=True)
class ChampionDecision:
    """The outcome of ``decide_champion``."""

    model_name: str
    alias: str
    version: int  # the candidate
    score: float  # the candidate's score
    margin: float
    moved: bool  # the alias now points at ``version`` because of this decision
    champion_version: int | None  # the alias's version after the decision (None: no champion)
    previous_version: int | None  # before the decision
    previous_score: float | None
    reason: str  # one line


def _model_name(cfg: RegistryConfig) -> str:
    if not cfg.model_name:
        raise RegistryError("registry.model_name is null: set it to the registered model that runs build on")
    filter_by_name(cfg.model_name)  # rejects a name no search filter can quote
    return cfg.model_name


def lock_model_name(cfg: RegistryConfig) -> str:
    """The registered model that holds the champion lock's tickets."""
    return f"{_model_name(cfg)}.{cfg.champion_alias}.lock"


def _parse_score(text: str | None) -> float | None:
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
    tracking_uri: str, cfg: RegistryConfig, run_id: str, model_dir: str | Path, score: float
) -> int:
    """Log ``model_dir`` (a Hugging Face directory) under ``model/`` of run ``run_id`` and register it as a new
    version of ``cfg.model_name`` (created if missing), tagged with ``score``. Returns the version number.
    A run registers one version: when ``run_id`` already has one (a retried task), that one is returned.

    Raises RegistryError when the name is null, the directory is not a model, the run does not exist, or
    MLflow fails."""
    name = _model_name(cfg)
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
    tags = {SCORE_TAG: repr(score), METRIC_TAG: cfg.score_metric}
    mv = call(
        tracking_uri,
        where,
        lambda: retry_transient(
            lambda: client.create_model_version(
                name, source, run_id=run_id, tags=tags, description=f"{cfg.score_metric}={score:.6g}"
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
    name, alias = _model_name(cfg), cfg.champion_alias
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
    path = call(tracking_uri, where, lambda: _download(client, tracking_uri, mv, Path(dest_dir)))
    return FetchedModel(
        name=name, version=int(mv.version), run_id=mv.run_id or None, score=_parse_score(mv.tags.get(SCORE_TAG)),
        local_dir=path, source=mv.source,
    )  # fmt: skip


def _champion_score(client: MlflowClient, uri: str, cfg: RegistryConfig, mv: ModelVersion) -> float:
    """The champion's score under ``cfg.score_metric``: its tag, else its run's metric."""
    tagged = _parse_score(mv.tags.get(SCORE_TAG))
    if tagged is not None and mv.tags.get(METRIC_TAG, cfg.score_metric) == cfg.score_metric:
        return tagged
    if mv.run_id:
        try:
            metric = client.get_run(mv.run_id).data.metrics.get(cfg.score_metric)
        except MlflowException:
            metric = None
        if metric is not None:
            return float(metric)
    raise RegistryError(
        f"champion version {mv.version} of '{mv.name}' at {uri} has no {cfg.score_metric} score (tag {SCORE_TAG} "
        f"with {METRIC_TAG}={cfg.score_metric}, or that metric on its run): tag it with its score, or move "
        f"'{cfg.champion_alias}' by hand"
    )


def _current_champion(client: MlflowClient, uri: str, cfg: RegistryConfig) -> tuple[int, float] | None:
    name = _model_name(cfg)
    version = client.get_registered_model(name).aliases.get(cfg.champion_alias)
    if version is None:
        return None
    mv = client.get_model_version(name, str(version))
    return int(version), _champion_score(client, uri, cfg, mv)


def _rule(cfg: RegistryConfig, version: int, score: float, prev: tuple[int, float] | None) -> tuple[bool, str]:
    alias, margin = cfg.champion_alias, cfg.champion_margin
    if not math.isfinite(score):
        return False, f"v{version} does not take '{alias}': its {cfg.score_metric} is {score} (not finite)"
    if prev is None:
        return True, f"v{version} takes '{alias}': no champion yet ({cfg.score_metric} {score:.6g})"
    pv, ps = prev
    if pv == version:
        return False, f"v{version} already holds '{alias}'"
    if not math.isfinite(ps):
        return True, f"v{version} takes '{alias}' from v{pv}, whose {cfg.score_metric} is {ps} ({score:.6g})"
    if score > ps + margin:
        return True, f"v{version} takes '{alias}' from v{pv}: {score:.6g} > {ps:.6g} + margin {margin:g}"
    return False, f"'{alias}' stays on v{pv}: v{version}'s {score:.6g} is not above {ps:.6g} + margin {margin:g}"


def decide_champion(tracking_uri: str, cfg: RegistryConfig, version: int, score: float) -> ChampionDecision:
    """Move ``cfg.champion_alias`` to ``version`` when ``score`` beats the champion's by more than the margin
    (or there is no champion); a non-finite score never wins. The read and the move run under the registry
    lock (``registry_lock``), waiting at most ``cfg.lock_timeout_s``.

    Raises RegistryLockTimeout when another decision holds the lock too long, RegistryError when the version
    does not exist, the champion has no score, or MLflow fails."""
    name, alias = _model_name(cfg), cfg.champion_alias
    if alias.lower() == "latest":
        raise RegistryError("registry.champion_alias 'latest' is reserved by MLflow: choose another alias")
    version, score = int(version), float(score)
    client = open_client(tracking_uri)
    where = f"deciding the '{alias}' of '{name}' for v{version}"
    try:
        mv = client.get_model_version(name, str(version))
    except Exception as exc:
        if is_missing(exc):
            raise RegistryError(
                f"version {version} of registered model '{name}' does not exist at {tracking_uri}: register it "
                "first (register_final_model) with the same tracking.uri"
            ) from None
        raise RegistryError(f"{where}: {explain(tracking_uri, exc)}") from exc

    def decide(lock: RegistryLock | None) -> ChampionDecision:
        prev = _current_champion(client, tracking_uri, cfg)
        moved, reason = _rule(cfg, version, score, prev)
        if moved:
            if lock is not None:
                lock.check_held()
            client.set_registered_model_alias(name, alias, str(version))
        after = version if moved else (prev[0] if prev else None)
        return ChampionDecision(
            model_name=name, alias=alias, version=version, score=score, margin=cfg.champion_margin, moved=moved,
            champion_version=after, previous_version=prev[0] if prev else None,
            previous_score=prev[1] if prev else None, reason=reason,
        )  # fmt: skip

    if not math.isfinite(score):  # it cannot win, so it reads without queueing
        return call(tracking_uri, where, lambda: decide(None))
    lock = RegistryLock(
        client,
        lock_model_name(cfg),
        owner=f"'{name}' v{version}",
        timeout_s=cfg.lock_timeout_s,
        stale_after_s=cfg.lock_timeout_s,
        source=mv.source,
        run_id=mv.run_id or None,
        description=f"DockFlow lock of the '{alias}' decision of '{name}': each version is a queue ticket, not a model.",
    )

    def locked() -> ChampionDecision:
        with lock:
            return decide(lock)

    return call(tracking_uri, where, locked)


def decision_metrics(decision: ChampionDecision) -> tuple[dict[str, float], dict[str, str]]:
    """What the caller logs to its run: metrics ``registry/...`` (non-finite values left out) and tags
    ``registry.decision`` (the reason), ``registry.model``, ``registry.version``, ``registry.champion_version``."""
    metrics = {
        "registry/version": float(decision.version),
        "registry/champion_moved": 1.0 if decision.moved else 0.0,
        "registry/champion_margin": float(decision.margin),
        "registry/score": decision.score,
    }
    if decision.previous_score is not None:
        metrics["registry/champion_score_before"] = decision.previous_score
    if decision.previous_version is not None:
        metrics["registry/champion_version_before"] = float(decision.previous_version)
    if decision.champion_version is not None:
        metrics["registry/champion_version"] = float(decision.champion_version)
    metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}
    champion = "none" if decision.champion_version is None else str(decision.champion_version)
    tags = {
        "registry.decision": decision.reason,
        "registry.model": decision.model_name,
        "registry.version": str(decision.version),
        "registry.champion_version": champion,
    }
    return metrics, tags
