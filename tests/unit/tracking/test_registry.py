"""Model Registry against a real SQLite store: register, fetch latest/champion, the champion rule, errors.
The lock and concurrent decisions: ``test_registry_lock.py``."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures.mlflow_store import IDENTITY, Store

from dockflow.config import RegistryConfig
from dockflow.tracking.champion import ChampionDecision, decide_champion, decision_metrics
from dockflow.tracking.registry import RegistryError, fetch_registered_model, register_final_model
from dockflow.tracking.store import TrackingError


def _cfg(name: str | None, **kw: object) -> RegistryConfig:
    return RegistryConfig(model_name=name, **kw)


def test_register_two_versions_and_fetch_latest(
    store: Store, hf_dir: Callable[[int], Path], model_name: str, tmp_path: Path
) -> None:
    cfg = _cfg(model_name)
    runs = [store.new_run("first"), store.new_run("second")]
    dirs = [hf_dir(1), hf_dir(2)]
    versions = [register_final_model(store.uri, cfg, runs[i], dirs[i], s) for i, s in enumerate([0.5, 0.6])]
    assert versions == [1, 2]
    mv = store.client().get_model_version(model_name, "2")
    assert mv.run_id == runs[1] and mv.tags == {"dockflow.score": "0.6", "dockflow.score_metric": "eval/test_accuracy"}
    assert mv.source.startswith("file://") and mv.source.endswith(f"{runs[1]}/artifacts/model")
    assert [a.path for a in store.client().list_artifacts(runs[1])] == ["model"]

    got = fetch_registered_model(store.uri, cfg, "latest", tmp_path / "start")
    assert (got.name, got.version, got.run_id, got.score) == (model_name, 2, runs[1], 0.6)
    assert got.local_dir.parent == tmp_path / "start"
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (got.local_dir / f).read_bytes() == (dirs[1] / f).read_bytes()
    again = fetch_registered_model(store.uri, cfg, "latest", tmp_path / "start")  # replaces the old copy
    assert again.local_dir == got.local_dir and (again.local_dir / "model.safetensors").read_bytes() == (
        dirs[1] / "model.safetensors"
    ).read_bytes()
    assert sorted(p.name for p in (tmp_path / "start").iterdir()) == [got.local_dir.name]  # no download leftovers


def test_registering_a_run_twice_returns_its_version(
    store: Store, hf_dir: Callable[[int], Path], model_name: str
) -> None:
    cfg, run = _cfg(model_name), store.new_run()
    assert register_final_model(store.uri, cfg, run, hf_dir(1), 0.5) == 1
    assert register_final_model(store.uri, cfg, run, hf_dir(1), 0.5) == 1  # a retried pipeline task
    assert len(store.client().search_model_versions(f"name='{model_name}'")) == 1


def _aliases(store: Store, name: str) -> dict[str, int]:
    return {k: int(v) for k, v in store.client().get_registered_model(name).aliases.items()}


def _register(store: Store, cfg: RegistryConfig, hf_dir: Callable[[int], Path], seed: int, score: float) -> int:
    return register_final_model(store.uri, cfg, store.new_run(f"v{seed}"), hf_dir(seed), score, tags=IDENTITY)


def test_champion_rule_with_margin(
    store: Store, hf_dir: Callable[[int], Path], model_name: str, tmp_path: Path
) -> None:
    cfg = _cfg(model_name, champion_margin=0.05)
    v1 = _register(store, cfg, hf_dir, 1, 0.50)
    first = decide_champion(store.uri, cfg, v1, 0.50)
    assert first == ChampionDecision(
        model_name=model_name, alias="champion", version=1, score=0.5, margin=0.05, moved=True,
        champion_version=1, previous_version=None, previous_score=None, reason=first.reason, comparison="first",
        fingerprint=IDENTITY["dockflow.eval.fingerprint"],
    )  # fmt: skip
    assert "no champion yet" in first.reason

    not_enough = decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 2, 0.54), 0.54)
    assert (not_enough.moved, not_enough.champion_version, not_enough.previous_score) == (False, 1, 0.5)
    assert "stays on v1" in not_enough.reason and "margin 0.05" in not_enough.reason
    assert (not_enough.comparison, not_enough.compared_score) == ("same_evaluation", 0.5)
    assert not_enough.compared() == "v2 0.54 on evaluation 0123456789abcdef vs v1 0.5 on evaluation 0123456789abcdef"
    worse = decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 3, 0.40), 0.40)
    assert (worse.moved, worse.champion_version) == (False, 1)
    nan = decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 4, math.nan), math.nan)
    assert (nan.moved, nan.champion_version) == (False, 1) and "not finite" in nan.reason

    v5 = _register(store, cfg, hf_dir, 5, 0.56)
    better = decide_champion(store.uri, cfg, v5, 0.56)
    assert (better.moved, better.champion_version, better.previous_version, better.previous_score) == (True, 5, 1, 0.5)
    assert _aliases(store, model_name) == {"champion": 5}
    assert decide_champion(store.uri, cfg, v5, 0.56).moved is False  # deciding again changes nothing

    assert not decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 6, 0.3), 0.3).moved

    champ = fetch_registered_model(store.uri, cfg, "champion", tmp_path / "start")
    assert (champ.version, champ.score) == (5, 0.56)
    assert (champ.local_dir / "model.safetensors").read_bytes() == (tmp_path / "model-5" / "model.safetensors").read_bytes()
    latest = fetch_registered_model(store.uri, cfg, "latest", tmp_path / "start")
    assert (latest.version, latest.score) == (6, 0.3) and latest.local_dir != champ.local_dir
    assert store.live_tickets(cfg) == []


def test_non_finite_score_never_wins_even_without_champion(
    store: Store, hf_dir: Callable[[int], Path], model_name: str
) -> None:
    cfg = _cfg(model_name)
    v1 = _register(store, cfg, hf_dir, 1, math.inf)
    d = decide_champion(store.uri, cfg, v1, math.inf)
    assert (d.moved, d.champion_version, d.previous_version) == (False, None, None)
    assert _aliases(store, model_name) == {}


def test_champion_score_falls_back_to_its_run_metric(
    store: Store, hf_dir: Callable[[int], Path], model_name: str
) -> None:
    cfg = _cfg(model_name, score_metric="eval/pass_at_8")
    run = store.new_run("old")
    v1 = register_final_model(store.uri, _cfg(model_name), run, hf_dir(1), 0.9, tags=IDENTITY)  # another metric
    store.client().set_registered_model_alias(model_name, "champion", str(v1))
    with pytest.raises(RegistryError, match=r"champion version 1 .* has no eval/pass_at_8 score"):
        decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 2, 0.5), 0.5)
    store.client().log_metric(run, "eval/pass_at_8", 0.7)
    d = decide_champion(store.uri, cfg, 2, 0.5)
    assert (d.moved, d.previous_score) == (False, 0.7)


def test_decision_metrics() -> None:
    moved = ChampionDecision("m", "champion", 3, 0.8, 0.01, True, 3, 1, 0.5, "v3 takes 'champion' from v1")
    metrics, tags = decision_metrics(moved)
    assert metrics == {
        "registry/version": 3.0, "registry/champion_moved": 1.0, "registry/champion_margin": 0.01,
        "registry/score": 0.8, "registry/champion_score_before": 0.5, "registry/champion_version_before": 1.0,
        "registry/champion_version": 3.0,
    }  # fmt: skip
    assert tags == {
        "registry.decision": "v3 takes 'champion' from v1", "registry.model": "m", "registry.version": "3",
        "registry.champion_version": "3", "registry.comparison": "",
        "registry.compared": "v3 0.8 on evaluation unknown; no score compared (none)",
    }  # fmt: skip
    lost = ChampionDecision("m", "champion", 1, math.nan, 0.0, False, None, None, None, "not finite")
    metrics, tags = decision_metrics(lost)
    assert metrics == {"registry/version": 1.0, "registry/champion_moved": 0.0, "registry/champion_margin": 0.0}
    assert tags["registry.champion_version"] == "none"
    rescored = ChampionDecision("m", "champion", 4, 0.8, 0.0, False, 1, 1, 0.5, "stays", comparison="rescored",
                                fingerprint="aa", champion_fingerprint="bb", compared_score=0.9, compared_on="aa")
    metrics, tags = decision_metrics(rescored)
    assert metrics["registry/champion_score_compared"] == 0.9 and metrics["registry/champion_score_before"] == 0.5
    assert tags["registry.compared"] == "v4 0.8 on evaluation aa vs v1 0.9 on evaluation aa (re-scored)"
    assert tags["registry.comparison"] == "rescored"


def test_fetch_errors_name_model_alias_uri_and_fix(
    store: Store, hf_dir: Callable[[int], Path], model_name: str, tmp_path: Path
) -> None:
    cfg = _cfg(model_name)
    with pytest.raises(RegistryError) as info:
        fetch_registered_model(store.uri, cfg, "champion", tmp_path)
    msg = str(info.value)
    assert "\n" not in msg
    assert f"'{model_name}' does not exist at {store.uri}" in msg and "continue_from: base" in msg

    store.client().create_registered_model(model_name)
    with pytest.raises(RegistryError, match=f"'{model_name}' at .* has no versions .*continue_from: base"):
        fetch_registered_model(store.uri, cfg, "latest", tmp_path)
    _register(store, cfg, hf_dir, 1, 0.5)
    with pytest.raises(RegistryError) as info:
        fetch_registered_model(store.uri, cfg.model_copy(update={"champion_alias": "best"}), "champion", tmp_path)
    msg = str(info.value)
    assert f"'{model_name}' at {store.uri} has no 'best' alias" in msg
    assert "continue_from: base" in msg and "continue_from: latest" in msg
    with pytest.raises(ValueError, match="latest' or 'champion"):
        fetch_registered_model(store.uri, cfg, "newest", tmp_path)  # type: ignore[arg-type]


def test_other_errors(store: Store, hf_dir: Callable[[int], Path], model_name: str, tmp_path: Path) -> None:
    run = store.new_run()
    with pytest.raises(RegistryError, match="registry.model_name is null"):
        register_final_model(store.uri, _cfg(None), run, hf_dir(1), 0.5)
    with pytest.raises(RegistryError, match="no config.json"):
        register_final_model(store.uri, _cfg(model_name), run, tmp_path, 0.5)
    with pytest.raises(RegistryError, match="run 0123abc does not exist"):
        register_final_model(store.uri, _cfg(model_name), "0123abc", hf_dir(1), 0.5)
    with pytest.raises(RegistryError, match=f"version 7 of registered model '{model_name}' does not exist"):
        decide_champion(store.uri, _cfg(model_name), 7, 0.5)
    with pytest.raises(RegistryError, match="reserved"):
        decide_champion(store.uri, _cfg(model_name, champion_alias="latest"), 1, 0.5)
    assert issubclass(RegistryError, TrackingError)
