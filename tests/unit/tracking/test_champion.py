"""The champion gate against a real SQLite store: lineage, same and other evaluations, re-scoring (and its
failures), a champion that changes while it is re-scored. Against an MLflow server with real models:
``tests/integration/test_model_registry_server.py``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from fixtures.mlflow_store import IDENTITY, Store

from dockflow.config import RegistryConfig
from dockflow.config.data import DataConfig
from dockflow.config.sections import EvalConfig
from dockflow.data import Example
from dockflow.eval import EvalInputs
from dockflow.eval.registered import RegisteredScorer
from dockflow.tracking.champion import RESCORE_ROUNDS, decide_champion
from dockflow.tracking.registry import register_final_model
from dockflow.tracking.tags import BASE_MODEL_TAG, FINGERPRINT_TAG, TASK_TAG

FP = IDENTITY[FINGERPRINT_TAG]


def _register(store: Store, cfg: RegistryConfig, hf_dir: Callable[[int], Path], seed: int, score: float,
              **tags: str | None) -> int:
    """A version with IDENTITY's tags, ``tags`` replacing some (None: left out)."""
    keys = {"fingerprint": FINGERPRINT_TAG, "task": TASK_TAG, "base": BASE_MODEL_TAG}
    merged = {**IDENTITY, **{keys[k]: v for k, v in tags.items()}}
    merged = {k: v for k, v in merged.items() if v is not None}
    return register_final_model(store.uri, cfg, store.new_run(f"v{seed}"), hf_dir(seed), score, tags=merged)


def _champion(store: Store, name: str) -> int:
    return int(store.client().get_registered_model(name).aliases["champion"])


def test_another_task_or_base_model_registers_without_competing(
    store: Store, hf_dir: Callable[[int], Path], model_name: str
) -> None:
    cfg = RegistryConfig(model_name=model_name)
    assert decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 1, 0.5), 0.5).moved
    llama = decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 2, 0.99, base="path /models/llama"), 0.99)
    assert (llama.moved, llama.champion_version, llama.comparison, llama.compared_score) == (
        False, 1, "other_lineage", None)
    assert llama.reason == ("'champion' stays on v1, not ranked against v2: its base model is 'tiny qwen2', v2's is "
                            "'path /models/llama'")
    desc = store.client().get_model_version(model_name, "2").description
    assert desc.startswith(f"eval/test_accuracy=0.99 on evaluation {FP}.") and llama.reason in desc
    other_task = decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 3, 0.99, task="file train=ab"), 0.99)
    assert not other_task.moved and "its task is 'arithmetic digits=2 ops=+-', v3's is 'file train=ab'" in other_task.reason

    # a champion registered before the lineage tags is unknown, not the same
    old = register_final_model(store.uri, cfg, store.new_run("old"), hf_dir(4), 0.1)
    store.client().set_registered_model_alias(model_name, "champion", str(old))
    unknown = decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 5, 0.99), 0.99)
    assert (unknown.moved, unknown.champion_version) == (False, old)
    assert "v4 has no task tag (registered before DockFlow tagged lineage): its task is unknown" in unknown.reason
    assert _champion(store, model_name) == old and store.live_tickets(cfg) == []


def test_another_evaluation_is_compared_on_the_champion_rescored(
    store: Store, hf_dir: Callable[[int], Path], model_name: str
) -> None:
    cfg = RegistryConfig(model_name=model_name, champion_margin=0.01)
    assert decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 1, 0.5), 0.5).moved
    calls: list[int] = []

    def rescore(version: int) -> tuple[float, str]:
        calls.append(version)
        return 0.9, "easy"

    easy = decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 2, 0.8, fingerprint="easy"), 0.8, rescore)
    assert calls == [1] and (easy.moved, easy.champion_version, easy.comparison) == (False, 1, "rescored")
    assert (easy.previous_score, easy.compared_score, easy.compared_on, easy.champion_fingerprint) == (0.5, 0.9, "easy", FP)
    assert easy.reason == ("'champion' stays on v1: v2's 0.8 is not above 0.9 + margin 0.01 on v2's evaluation easy "
                           f"(v1 re-scored; its own 0.5 on {FP})")
    assert easy.compared() == "v2 0.8 on evaluation easy vs v1 0.9 on evaluation easy (re-scored)"
    assert easy.compared() in store.client().get_model_version(model_name, "2").description

    better = decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 3, 0.95, fingerprint="easy"), 0.95, rescore)
    assert calls == [1, 1] and better.moved and _champion(store, model_name) == 3
    same = decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 4, 0.97, fingerprint="easy"), 0.97, rescore)
    assert calls == [1, 1] and same.moved and same.comparison == "same_evaluation"  # no re-scoring needed

    unscored = decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 5, 0.99), 0.99)  # no rescorer here
    assert (unscored.moved, unscored.comparison) == (False, "not_scored")
    assert "it was scored on another evaluation (easy, v5's is" in unscored.reason
    chat = decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 6, 0.99), 0.99, lambda v: (0.1, "chat"))
    assert not chat.moved and "it ran evaluation chat, not v6's" in chat.reason
    assert _champion(store, model_name) == 4 and store.live_tickets(cfg) == []


def test_a_champion_that_cannot_be_scored_keeps_the_alias(
    store: Store, hf_dir: Callable[[int], Path], model_name: str
) -> None:
    cfg = RegistryConfig(model_name=model_name)
    assert decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 1, 0.5), 0.5).moved  # random bytes, no model
    inputs = EvalInputs(EvalConfig(), DataConfig(), 8, 0)
    scorer = RegisteredScorer(store.uri, cfg, inputs, "float32", torch.device("cpu"))
    v2 = _register(store, cfg, hf_dir, 2, 0.9, fingerprint="other")
    d = decide_champion(store.uri, cfg, v2, 0.9, lambda v: scorer.score(v, [Example("1 + 1", "2")], "test"))
    assert (d.moved, d.champion_version, d.comparison) == (False, 1, "not_scored")
    assert d.reason.startswith(f"'champion' stays on v1: it could not be scored on v2's evaluation other (version 1 "
                               f"of '{model_name}' does not load as a model (KeyError: ")
    assert "\n" not in d.reason, d.reason


def test_a_champion_that_changes_while_it_is_rescored_is_rescored_again(
    store: Store, hf_dir: Callable[[int], Path], model_name: str
) -> None:
    cfg = RegistryConfig(model_name=model_name)
    assert decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 1, 0.5), 0.5).moved
    meanwhile = _register(store, cfg, hf_dir, 2, 0.6, fingerprint="third")
    calls: list[int] = []

    def rescore(version: int) -> tuple[float, str]:
        calls.append(version)
        if version == 1:  # another run's decision moves the alias while this one scores v1
            store.client().set_registered_model_alias(model_name, "champion", str(meanwhile))
        return {1: 0.3, 2: 0.4}[version], "mine"

    d = decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 3, 0.8, fingerprint="mine"), 0.8, rescore)
    assert calls == [1, 2] and d.moved and (d.previous_version, d.compared_score) == (2, 0.4)

    others = [_register(store, cfg, hf_dir, 10 + i, 0.1, fingerprint=f"o{i}") for i in range(RESCORE_ROUNDS)]

    def always_moving(version: int) -> tuple[float, str]:
        store.client().set_registered_model_alias(model_name, "champion", str(others.pop()))
        return 0.0, "last"

    gave_up = decide_champion(store.uri, cfg, _register(store, cfg, hf_dir, 20, 0.9, fingerprint="last"), 0.9,
                              always_moving)
    assert (gave_up.moved, gave_up.comparison) == (False, "champion_changed")
    assert f"'champion' moved {RESCORE_ROUNDS} times while v" in gave_up.reason and store.live_tickets(cfg) == []
