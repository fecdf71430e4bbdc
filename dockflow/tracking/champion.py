"""The champion gate: whether a newly registered version takes the champion alias, comparing like with like.

    decision = decide_champion(uri, cfg.registry, version, score, rescore=score_champion)
    metrics, tags = decision_metrics(decision)       # log them to the run

The gate reads both versions' identity tags (``dockflow.tracking.tags``: the evaluation's fingerprint, the task
and the base model) and decides, in this order:

1. a non-finite score never wins; with no champion yet, a finite one takes the alias;
2. a champion of another task or base model (or one registered without these tags: unknown, not the same) is
   not ranked against: the version is registered, the alias stays, and the reason names the difference;
3. the same evaluation (equal fingerprints): the scores are compared, as recorded;
4. another evaluation: the champion is scored on the challenger's evaluation (``rescore``: the run's own
   evaluation code, on the same examples) and the challenger's score is compared with that; a champion that
   cannot be loaded or scored keeps the alias, with one line saying why.

Winning means beating the compared score by more than ``registry.champion_margin``. The read of the champion
and the alias move happen under the registry lock (``dockflow.tracking.registry_lock``), so two runs finishing
together cannot both win against the same old champion.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from dockflow.config import RegistryConfig
from dockflow.tracking.champion_rule import (
    Rescored,
    Rescorer,
    Side,
    Verdict,
    fp,
    judge,
    num,
    rescore_champion,
)
from dockflow.tracking.registry import METRIC_TAG, SCORE_TAG, lock_model_name, parse_score, registered_name
from dockflow.tracking.registry_client import RegistryError, call, is_missing, open_client
from dockflow.tracking.registry_lock import RegistryLock
from dockflow.tracking.store import explain

__all__ = ["ChampionDecision", "Rescorer", "decide_champion", "decision_metrics"]

log = logging.getLogger(__name__)

RESCORE_ROUNDS = 3  # champions re-scored for one decision before giving up (the alias kept moving meanwhile)


@dataclass(frozen=True)
class ChampionDecision:
    """The outcome of ``decide_champion``: what was compared with what, and whether the alias moved."""

    model_name: str
    alias: str
    version: int  # the candidate
    score: float  # the candidate's score
    margin: float
    moved: bool  # the alias now points at ``version`` because of this decision
    champion_version: int | None  # the alias's version after the decision (None: no champion)
    previous_version: int | None  # before the decision
    previous_score: float | None  # the champion's own recorded score (on its own evaluation)
    reason: str  # one line
    # first, same_evaluation, rescored, other_lineage, not_scored, champion_changed, not_finite or already
    comparison: str = ""
    fingerprint: str | None = None  # the candidate's evaluation
    champion_fingerprint: str | None = None  # the champion's own evaluation
    compared_score: float | None = None  # the champion's score the candidate was compared with
    compared_on: str | None = None  # the evaluation that score comes from

    def compared(self) -> str:
        """One line: what was compared with what."""
        mine = f"v{self.version} {num(self.score)} on evaluation {fp(self.fingerprint)}"
        if self.compared_score is None:
            return f"{mine}; no score compared ({self.comparison or 'none'})"
        rescored = " (re-scored)" if self.comparison == "rescored" else ""
        return (
            f"{mine} vs v{self.previous_version} {num(self.compared_score)} on evaluation "
            f"{fp(self.compared_on)}{rescored}"
        )


def _champion_score(client: MlflowClient, uri: str, cfg: RegistryConfig, mv: ModelVersion) -> float:
    """The champion's score under ``cfg.score_metric``: its tag, else its run's metric."""
    tagged = parse_score(mv.tags.get(SCORE_TAG))
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


def _champion(client: MlflowClient, cfg: RegistryConfig) -> ModelVersion | None:
    name = registered_name(cfg)
    version = client.get_registered_model(name).aliases.get(cfg.champion_alias)
    return None if version is None else client.get_model_version(name, str(version))


class _Gate:
    """One decision's state: the candidate, the champions re-scored so far (outside the lock)."""

    def __init__(
        self,
        client: MlflowClient,
        uri: str,
        cfg: RegistryConfig,
        mv: ModelVersion,
        score: float,
        rescore: Rescorer | None,
    ) -> None:
        self.client, self.uri, self.cfg, self.score, self.rescore = client, uri, cfg, score, rescore
        self.me = Side.of(mv)
        self.rescored: dict[int, Rescored] = {}

    def needs_rescore(self, champ: ModelVersion | None) -> bool:
        """Whether ``champ`` must be scored on the candidate's evaluation before the rule can compare."""
        if champ is None or self.rescore is None or not math.isfinite(self.score):
            return False
        side = Side.of(champ)
        return side.version != self.me.version and self.me.lineage_differs(side) is None and (
            not self.me.same_evaluation(side)
        )

    def rescore_outside_lock(self) -> None:
        if self.rescore is None:
            return
        champ = _champion(self.client, self.cfg)
        if self.needs_rescore(champ) and int(champ.version) not in self.rescored:
            self.rescored[int(champ.version)] = rescore_champion(self.rescore, int(champ.version))

    def decide(self, lock: RegistryLock | None) -> ChampionDecision | None:
        """Under ``lock``: decide and move the alias; None when the champion changed to one not re-scored yet."""
        cfg, name = self.cfg, registered_name(self.cfg)
        champ = _champion(self.client, cfg)
        if self.needs_rescore(champ) and int(champ.version) not in self.rescored:
            return None
        side = Side.of(champ) if champ is not None else None
        own = self.own_score(champ) if champ is not None else None
        verdict = judge(cfg, self.me, self.score, side, own, self.rescored.get(side.version) if side else None)
        if verdict.moved:
            if lock is not None:
                lock.check_held()
            self.client.set_registered_model_alias(name, cfg.champion_alias, str(self.me.version))
        return self.decision(verdict, side, own)

    def own_score(self, champ: ModelVersion) -> float | None:
        """The champion's recorded score: required (``_champion_score``) when it is compared as recorded."""
        side = Side.of(champ)
        if side.version != self.me.version and self.me.same_evaluation(side) and self.me.lineage_differs(side) is None:
            return _champion_score(self.client, self.uri, self.cfg, champ)
        metric = champ.tags.get(METRIC_TAG, self.cfg.score_metric)
        return parse_score(champ.tags.get(SCORE_TAG)) if metric == self.cfg.score_metric else None

    def decision(self, verdict: Verdict, side: Side | None, own: float | None) -> ChampionDecision:
        after = self.me.version if verdict.moved else (side.version if side else None)
        return ChampionDecision(
            model_name=registered_name(self.cfg), alias=self.cfg.champion_alias, version=self.me.version,
            score=self.score, margin=self.cfg.champion_margin, moved=verdict.moved, champion_version=after,
            previous_version=side.version if side else None, previous_score=own, reason=verdict.reason,
            comparison=verdict.comparison, fingerprint=self.me.fingerprint,
            champion_fingerprint=side.fingerprint if side else None, compared_score=verdict.compared_score,
            compared_on=verdict.compared_on,
        )  # fmt: skip

    def gave_up(self) -> ChampionDecision:
        champ = _champion(self.client, self.cfg)
        side = Side.of(champ) if champ is not None else None
        reason = (
            f"'{self.cfg.champion_alias}' moved {RESCORE_ROUNDS} times while v{self.me.version} re-scored "
            f"the champion: v{self.me.version} registered without competing; decide again (decide_champion)"
        )
        return self.decision(Verdict(False, reason, "champion_changed"), side, None)


def decide_champion(
    tracking_uri: str, cfg: RegistryConfig, version: int, score: float, rescore: Rescorer | None = None
) -> ChampionDecision:
    """Move ``cfg.champion_alias`` to ``version`` when it beats the champion like with like (module doc).

    Re-scoring a champion (``rescore``: minutes for a large model) happens outside the registry lock, which is
    held only to read the champion and move the alias, so other runs' decisions never wait on model work (their
    wait is bounded by ``cfg.lock_timeout_s``). If, under the lock, the champion is no longer the one re-scored
    (another run moved the alias meanwhile), the lock is released and the new champion re-scored, at most
    ``RESCORE_ROUNDS`` champions in all; after that the version stays registered without competing, and the
    reason says so. The version's description then says what was compared with what.

    Raises RegistryLockTimeout when another decision holds the lock too long, RegistryError when the version
    does not exist, a champion on the same evaluation has no score, or MLflow fails."""
    name, alias = registered_name(cfg), cfg.champion_alias
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
    gate = _Gate(client, tracking_uri, cfg, mv, score, rescore)
    decision = None
    if not math.isfinite(score):  # it cannot win, so it reads without queueing
        decision = call(tracking_uri, where, lambda: gate.decide(None))
    for _ in range(RESCORE_ROUNDS):
        if decision is not None:
            break
        call(tracking_uri, where, gate.rescore_outside_lock)
        lock = RegistryLock(
            client, lock_model_name(cfg), owner=f"'{name}' v{version}", timeout_s=cfg.lock_timeout_s,
            stale_after_s=cfg.lock_timeout_s, source=mv.source, run_id=mv.run_id or None,
            description=f"DockFlow lock of the '{alias}' decision of '{name}': each version is a queue ticket, not a model.",
        )  # fmt: skip

        def locked(lock: RegistryLock = lock) -> ChampionDecision | None:
            with lock:
                return gate.decide(lock)

        decision = call(tracking_uri, where, locked)
    if decision is None:
        decision = call(tracking_uri, where, gate.gave_up)
    _describe(client, cfg, decision)
    return decision


def _describe(client: MlflowClient, cfg: RegistryConfig, d: ChampionDecision) -> None:
    """The version's description: its score, the evaluation it comes from, and the decision (best effort)."""
    text = f"{cfg.score_metric}={d.score:.6g} on evaluation {fp(d.fingerprint)}. {d.compared()}. {d.reason}"
    try:
        client.update_model_version(d.model_name, str(d.version), description=text)
    except MlflowException as exc:
        log.warning("could not describe v%s of '%s': %s", d.version, d.model_name, exc)


def decision_metrics(decision: ChampionDecision) -> tuple[dict[str, float], dict[str, str]]:
    """What the caller logs to its run: metrics ``registry/...`` (non-finite values left out) and tags
    ``registry.decision`` (the reason), ``registry.compared`` (what was compared with what),
    ``registry.comparison``, ``registry.model``, ``registry.version``, ``registry.champion_version``."""
    metrics = {
        "registry/version": float(decision.version),
        "registry/champion_moved": 1.0 if decision.moved else 0.0,
        "registry/champion_margin": float(decision.margin),
        "registry/score": decision.score,
    }
    if decision.previous_score is not None:
        metrics["registry/champion_score_before"] = decision.previous_score
    if decision.compared_score is not None:
        metrics["registry/champion_score_compared"] = decision.compared_score
    if decision.previous_version is not None:
        metrics["registry/champion_version_before"] = float(decision.previous_version)
    if decision.champion_version is not None:
        metrics["registry/champion_version"] = float(decision.champion_version)
    metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}
    champion = "none" if decision.champion_version is None else str(decision.champion_version)
    tags = {
        "registry.decision": decision.reason,
        "registry.compared": decision.compared(),
        "registry.comparison": decision.comparison,
        "registry.model": decision.model_name,
        "registry.version": str(decision.version),
        "registry.champion_version": champion,
    }
    return metrics, tags
