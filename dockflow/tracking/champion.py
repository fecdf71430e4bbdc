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
from collections.abc import Callable
from dataclasses import dataclass

from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from dockflow.config import RegistryConfig
from dockflow.tracking.registry import METRIC_TAG, SCORE_TAG, lock_model_name, parse_score, registered_name
from dockflow.tracking.registry_client import RegistryError, call, is_missing, open_client
from dockflow.tracking.registry_lock import RegistryLock
from dockflow.tracking.store import explain
from dockflow.tracking.tags import BASE_MODEL_TAG, FINGERPRINT_TAG, TASK_TAG

__all__ = ["ChampionDecision", "Rescorer", "decide_champion", "decision_metrics"]

log = logging.getLogger(__name__)

Rescorer = Callable[[int], tuple[float, str]]
"""Scores champion version ``v`` on the challenger's evaluation: (its ``registry.score_metric``, the fingerprint
of the evaluation it ran). Raises when the version cannot be loaded or scored."""

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
        mine = f"v{self.version} {_num(self.score)} on evaluation {_fp(self.fingerprint)}"
        if self.compared_score is None:
            return f"{mine}; no score compared ({self.comparison or 'none'})"
        rescored = " (re-scored)" if self.comparison == "rescored" else ""
        return (
            f"{mine} vs v{self.previous_version} {_num(self.compared_score)} on evaluation "
            f"{_fp(self.compared_on)}{rescored}"
        )


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.6g}"


def _fp(fingerprint: str | None) -> str:
    return fingerprint or "unknown"


@dataclass(frozen=True)
class Side:
    """What the gate knows of one registered version: its identity tags (None where absent)."""

    version: int
    fingerprint: str | None
    task: str | None
    base_model: str | None

    @classmethod
    def of(cls, mv: ModelVersion) -> Side:
        tags = mv.tags or {}
        return cls(int(mv.version), tags.get(FINGERPRINT_TAG), tags.get(TASK_TAG), tags.get(BASE_MODEL_TAG))

    def lineage_differs(self, champion: Side) -> str | None:
        """Why ``champion`` is of another lineage than this version (None: the same task and base model)."""
        for what, mine, theirs in (
            ("task", self.task, champion.task),
            ("base model", self.base_model, champion.base_model),
        ):
            if mine is None or theirs is None:
                who = f"v{self.version}" if mine is None else f"v{champion.version}"
                return f"{who} has no {what} tag (registered before DockFlow tagged lineage): its {what} is unknown"
            if mine != theirs:
                return f"its {what} is '{theirs}', v{self.version}'s is '{mine}'"
        return None

    def same_evaluation(self, champion: Side) -> bool:
        return self.fingerprint is not None and self.fingerprint == champion.fingerprint


@dataclass(frozen=True)
class Rescored:
    """The champion scored on the challenger's evaluation, or why it could not be."""

    score: float | None
    fingerprint: str | None
    error: str | None = None


def _rescore(fn: Rescorer, version: int) -> Rescored:
    try:
        score, fingerprint = fn(version)
        return Rescored(float(score), fingerprint)
    except Exception as exc:  # any failure to load or score keeps the alias where it is, with the reason
        lines = str(exc).strip().splitlines()
        why = lines[0] if lines else type(exc).__name__
        log.warning("re-scoring champion v%s failed: %s", version, why)
        return Rescored(None, None, why)


@dataclass(frozen=True)
class Verdict:
    moved: bool
    reason: str
    comparison: str
    compared_score: float | None = None
    compared_on: str | None = None


def judge(
    cfg: RegistryConfig,
    me: Side,
    score: float,
    champ: Side | None,
    own: float | None,
    rescored: Rescored | None,
) -> Verdict:
    """The gate's rule (module doc) for candidate ``me`` with ``score`` against ``champ`` (its own recorded score
    ``own``; ``rescored``: it on ``me``'s evaluation, None when not done)."""
    alias, margin, v = cfg.champion_alias, cfg.champion_margin, me.version
    if not math.isfinite(score):
        return Verdict(
            False,
            f"v{v} does not take '{alias}': its {cfg.score_metric} is {score} (not finite)",
            "not_finite",
        )
    if champ is None:
        return Verdict(
            True, f"v{v} takes '{alias}': no champion yet ({cfg.score_metric} {score:.6g})", "first"
        )
    pv = champ.version
    if pv == v:
        return Verdict(False, f"v{v} already holds '{alias}'", "already")
    stays = f"'{alias}' stays on v{pv}"
    if why := me.lineage_differs(champ):
        return Verdict(False, f"{stays}, not ranked against v{v}: {why}", "other_lineage")
    if me.same_evaluation(champ):
        against, on, kind, where = (
            own,
            me.fingerprint,
            "same_evaluation",
            f"on the same evaluation {me.fingerprint}",
        )
    elif rescored is None:
        return Verdict(
            False,
            f"{stays}: it was scored on another evaluation ({_fp(champ.fingerprint)}, v{v}'s is "
            f"{_fp(me.fingerprint)}) and no re-scoring was possible here",
            "not_scored",
        )
    elif rescored.error is not None:
        return Verdict(
            False,
            f"{stays}: it could not be scored on v{v}'s evaluation {_fp(me.fingerprint)} ({rescored.error})",
            "not_scored",
        )
    elif rescored.fingerprint != me.fingerprint:
        return Verdict(
            False,
            f"{stays}: re-scored, it ran evaluation {_fp(rescored.fingerprint)}, not v{v}'s "
            f"{_fp(me.fingerprint)} (another chat template)",
            "not_scored",
        )
    else:
        against, on, kind = rescored.score, me.fingerprint, "rescored"
        where = f"on v{v}'s evaluation {me.fingerprint} (v{pv} re-scored; its own {_num(own)} on {_fp(champ.fingerprint)})"
    if against is None or not math.isfinite(against):  # None: never (_champion_score raises first)
        return Verdict(
            True,
            f"v{v} takes '{alias}' from v{pv}, whose {cfg.score_metric} is {against} ({score:.6g})",
            kind,
            against,
            on,
        )
    if score > against + margin:
        return Verdict(
            True,
            f"v{v} takes '{alias}' from v{pv}: {score:.6g} > {against:.6g} + margin {margin:g} {where}",
            kind,
            against,
            on,
        )
    return Verdict(
        False,
        f"{stays}: v{v}'s {score:.6g} is not above {against:.6g} + margin {margin:g} {where}",
        kind,
        against,
        on,
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
        self.client, self.uri, self.cfg, self.mv, self.score, self.rescore = (
            client,
            uri,
            cfg,
            mv,
            score,
            rescore,
        )
        self.me = Side.of(mv)
        self.rescored: dict[int, Rescored] = {}

    def needs_rescore(self, champ: ModelVersion | None) -> bool:
        if champ is None or self.rescore is None or not math.isfinite(self.score):
            return False
        side = Side.of(champ)
        return (
            side.version != self.me.version
            and self.me.lineage_differs(side) is None
            and not (self.me.same_evaluation(side))
        )

    def rescore_outside_lock(self) -> None:
        if self.rescore is None:
            return
        champ = _champion(self.client, self.cfg)
        if self.needs_rescore(champ) and int(champ.version) not in self.rescored:
            self.rescored[int(champ.version)] = _rescore(self.rescore, int(champ.version))

    def decide(self, lock: RegistryLock | None) -> ChampionDecision | None:
        """Under ``lock``: decide and move the alias; None when the champion changed to one not re-scored yet."""
        cfg, name = self.cfg, registered_name(self.cfg)
        champ = _champion(self.client, cfg)
        if self.needs_rescore(champ) and int(champ.version) not in self.rescored:
            return None
        side = Side.of(champ) if champ is not None else None
        own = None
        if side is not None:
            same = self.me.same_evaluation(side) and self.me.lineage_differs(side) is None
            own = (
                _champion_score(self.client, self.uri, cfg, champ)
                if same and side.version != self.me.version
                else (
                    parse_score(champ.tags.get(SCORE_TAG))
                    if champ.tags.get(METRIC_TAG) == cfg.score_metric
                    else None
                )
            )
        verdict = judge(
            cfg, self.me, self.score, side, own, self.rescored.get(side.version) if side else None
        )
        if verdict.moved:
            if lock is not None:
                lock.check_held()
            self.client.set_registered_model_alias(name, cfg.champion_alias, str(self.me.version))
        return self.decision(verdict, side, own)

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
    text = f"{cfg.score_metric}={d.score:.6g} on evaluation {_fp(d.fingerprint)}. {d.compared()}. {d.reason}"
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
