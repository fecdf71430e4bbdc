"""The champion gate's rule, apart from the registry: what each side's identity tags say, and the verdict.

    verdict = judge(cfg.registry, Side.of(candidate_mv), score, Side.of(champion_mv), own_score, rescored)

``dockflow.tracking.champion`` reads the versions, re-scores a champion when the rule needs it, holds the lock
and moves the alias; this module decides (its module doc lists the order of the rule).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from mlflow.entities.model_registry import ModelVersion

from dockflow.config import RegistryConfig
from dockflow.tracking.tags import BASE_MODEL_TAG, FINGERPRINT_TAG, TASK_TAG

log = logging.getLogger(__name__)

Rescorer = Callable[[int], tuple[float, str]]
"""Scores champion version ``v`` on the challenger's evaluation: (its ``registry.score_metric``, the fingerprint
of the evaluation it ran). Raises when the version cannot be loaded or scored."""


def num(x: float | None) -> str:
    """A score as text ("-": none)."""
    return "-" if x is None else f"{x:.6g}"


def fp(fingerprint: str | None) -> str:
    """A fingerprint as text ("unknown": a version registered without one)."""
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


def rescore_champion(fn: Rescorer, version: int) -> Rescored:
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
            f"{stays}: it was scored on another evaluation ({fp(champ.fingerprint)}, v{v}'s is "
            f"{fp(me.fingerprint)}) and no re-scoring was possible here",
            "not_scored",
        )
    elif rescored.error is not None:
        return Verdict(
            False,
            f"{stays}: it could not be scored on v{v}'s evaluation {fp(me.fingerprint)} ({rescored.error})",
            "not_scored",
        )
    elif rescored.fingerprint != me.fingerprint:
        return Verdict(
            False,
            f"{stays}: re-scored, it ran evaluation {fp(rescored.fingerprint)}, not v{v}'s "
            f"{fp(me.fingerprint)} (another chat template)",
            "not_scored",
        )
    else:
        against, on, kind = rescored.score, me.fingerprint, "rescored"
        where = f"on v{v}'s evaluation {me.fingerprint} (v{pv} re-scored; its own {num(own)} on {fp(champ.fingerprint)})"
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
