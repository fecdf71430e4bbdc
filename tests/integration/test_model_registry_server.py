"""Model Registry over HTTP: register, decide the champion (lock tickets included) and fetch through a real
``mlflow server`` on loopback (the session's ``mlflow_server`` fixture, ``tests/fixtures/mlflow_server.py``); the
champion gate with real models, re-scored by the run's own evaluation code (``finish.register``)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from dockflow.config import RegistryConfig, TrackingConfig
from dockflow.tracking import Tracker
from dockflow.tracking.champion import decide_champion
from dockflow.tracking.registry import (
    RegistryError,
    fetch_registered_model,
    lock_model_name,
    register_final_model,
)
from dockflow.tracking.tags import identity_tags

SAME = identity_tags("0123456789abcdef", {}, "arithmetic digits=2 ops=+-", "tiny qwen2")


def _hf_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "qwen2"}')
    (path / "model.safetensors").write_bytes(os.urandom(4096))
    (path / "tokenizer_config.json").write_text("{}")
    return path


def test_register_decide_fetch_through_server(mlflow_server: str, tmp_path: Path) -> None:
    cfg = RegistryConfig(model_name=f"server-model-{uuid.uuid4().hex[:8]}", champion_margin=0.02)
    tracking = TrackingConfig(uri=mlflow_server, experiment="registry")
    decisions = []
    for i, score in enumerate([0.5, 0.51, 0.6]):
        model = _hf_dir(tmp_path / f"final{i}")
        with Tracker.start(tracking, tmp_path, f"nightly-{i}") as tr:
            version = register_final_model(mlflow_server, cfg, tr.run_id, model, score, tags=SAME)
            decisions.append(decide_champion(mlflow_server, cfg, version, score))
    assert [(d.version, d.moved, d.champion_version) for d in decisions] == [(1, True, 1), (2, False, 1), (3, True, 3)]

    client = MlflowClient(tracking_uri=mlflow_server, registry_uri=mlflow_server)
    mv = client.get_model_version(cfg.model_name, "3")
    assert mv.source.startswith("mlflow-artifacts:") and mv.source.endswith("/artifacts/model")
    assert client.search_model_versions(f"name='{lock_model_name(cfg)}'") == []  # every ticket released
    assert client.get_registered_model(lock_model_name(cfg)).tags == {"dockflow.lock": "true"}

    champion = fetch_registered_model(mlflow_server, cfg, "champion", tmp_path / "start")
    assert (champion.version, champion.score) == (3, 0.6)
    assert (champion.local_dir / "model.safetensors").read_bytes() == (tmp_path / "final2" / "model.safetensors").read_bytes()
    assert sorted(p.name for p in champion.local_dir.iterdir()) == ["config.json", "model.safetensors", "tokenizer_config.json"]
    assert fetch_registered_model(mlflow_server, cfg, "latest", tmp_path / "start").version == 3

    with pytest.raises(RegistryError, match=f"does not exist at {mlflow_server}"):
        fetch_registered_model(mlflow_server, cfg.model_copy(update={"model_name": "nobody"}), "latest", tmp_path)


def _scored(model_dir: Path, examples: list, inputs) -> float:
    from dockflow.eval import evaluate_policy
    from dockflow.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(model_dir)
    return evaluate_policy(model, tok, examples, inputs)["eval/test_accuracy"]


def test_the_gate_compares_like_with_like(mlflow_server: str, tmp_path: Path) -> None:
    """(a) a challenger scored on an easier test set does not take the alias from a better model: the champion is
    re-scored on the challenger's evaluation and wins there; (b) the same evaluation moves it when the score is
    higher; (c) another base model registers without moving it. Models with known answers (``lookup_model_dir``,
    one token each), scored and re-scored by the run's evaluation code."""
    import torch
    from fixtures.tiny_models import lookup_model_dir

    from dockflow.config import load_config
    from dockflow.data import Example
    from dockflow.eval import EvalInputs
    from dockflow.eval.fingerprint import eval_identity
    from dockflow.eval.registered import RegisteredScorer
    from dockflow.flow.final_model import register

    name = f"gate-{uuid.uuid4().hex[:8]}"
    cfg = load_config("configs/grpo_arith.yaml", [
        f"registry.model_name={name}", f"tracking.uri={mlflow_server}", "tracking.experiment=gate",
        "rollout.max_new_tokens=1", "data.prompt_template='{prompt}'", "eval.batch_size=16",
        f"checkpoint.dir={tmp_path / 'ckpt'}",
    ])  # fmt: skip
    inputs = EvalInputs(cfg.eval, cfg.data, cfg.rollout.max_new_tokens, cfg.run.seed)
    digits = [str(d) for d in range(10)]
    echo = lookup_model_dir(tmp_path / "echo", {d: d for d in digits})  # answers the prompt's last digit
    shifted = lookup_model_dir(tmp_path / "shifted", {d: d if int(d) < 5 else str((int(d) + 1) % 10) for d in digits})
    hard = [Example(f"h{d}", d if int(d) < 5 else str((int(d) + 1) % 10)) for d in digits]  # echo 0.5, shifted 1.0
    easy = [Example(f"{c}{d}", d) for c in "ef" for d in "0123"] + [Example("e5", "5"), Example("e6", "6")]
    task = "arithmetic digits=2 ops=+-"

    def run(label: str, model_dir: Path, examples: list[Example], base: str = "tiny qwen2") -> tuple[dict, dict]:
        ident = eval_identity(examples, inputs)
        tags = identity_tags(ident.fingerprint, ident.fields(), task, base)
        scorer = RegisteredScorer(mlflow_server, cfg.registry, inputs, "float32", torch.device("cpu"))
        with Tracker.start(cfg.tracking, tmp_path, label) as tr:
            out = register(cfg, tr, str(model_dir), _scored(model_dir, examples, inputs), tags=tags,
                           rescore=lambda v: scorer.score(v, examples, "test"))
        return out, MlflowClient(mlflow_server).get_run(tr.run_id).data.tags

    champion, _ = run("champion", echo, hard)
    assert (champion["version"], champion["score"], champion["champion_moved"]) == (1, 0.5, True)
    hard_fp, easy_fp = eval_identity(hard, inputs).fingerprint, eval_identity(easy, inputs).fingerprint

    easier, tags = run("easier", shifted, easy)  # 0.8 on its easy set beats the champion's 0.5 on the hard one...
    assert (easier["score"], easier["previous_champion_score"]) == (0.8, 0.5)
    assert not easier["champion_moved"] and easier["champion_version"] == 1  # ...but not the champion re-scored
    assert (easier["comparison"], easier["compared_score"], easier["compared_on"]) == ("rescored", 1.0, easy_fp)
    assert (easier["fingerprint"], easier["champion_fingerprint"]) == (easy_fp, hard_fp)
    assert easier["compared"] == f"v2 0.8 on evaluation {easy_fp} vs v1 1 on evaluation {easy_fp} (re-scored)"
    assert tags["registry.compared"] == easier["compared"] and tags["registry.decision"] == easier["decision"]
    assert tags["registry.comparison"] == "rescored" and tags["registry.champion_version"] == "1"

    same, _ = run("same", shifted, hard)
    assert (same["version"], same["score"], same["champion_moved"], same["comparison"]) == (3, 1.0, True, "same_evaluation")
    assert same["decision"] == f"v3 takes 'champion' from v1: 1 > 0.5 + margin 0 on the same evaluation {hard_fp}"

    llama, _ = run("llama", echo, easy, base="path /models/llama")
    assert (llama["version"], llama["champion_moved"], llama["champion_version"]) == (4, False, 3)
    assert llama["decision"] == ("'champion' stays on v3, not ranked against v4: its base model is 'tiny qwen2', "
                                 "v4's is 'path /models/llama'")

    client = MlflowClient(tracking_uri=mlflow_server, registry_uri=mlflow_server)
    assert client.get_model_version_by_alias(name, "champion").version == "3"
    v2 = client.get_model_version(name, "2")
    assert v2.tags["dockflow.eval.fingerprint"] == easy_fp and v2.tags["dockflow.eval.num_prompts"] == "10"
    assert v2.tags["dockflow.eval.max_new_tokens"] == "1" and v2.tags["dockflow.eval.verifier"] == "math_verify"
    assert (v2.tags["dockflow.lineage.task"], v2.tags["dockflow.lineage.base_model"]) == (task, "tiny qwen2")
    assert easier["compared"] in v2.description and easier["decision"] in v2.description
    assert client.search_model_versions(f"name='{lock_model_name(cfg.registry)}'") == []
