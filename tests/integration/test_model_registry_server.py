"""Model Registry over HTTP: register, decide the champion (lock tickets included) and fetch through a real
``mlflow server`` on loopback (the session's ``mlflow_server`` fixture, ``tests/fixtures/mlflow_server.py``)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from dockflow.config import RegistryConfig, TrackingConfig
from dockflow.tracking import Tracker
from dockflow.tracking.registry import (
    RegistryError,
    decide_champion,
    fetch_registered_model,
    lock_model_name,
    register_final_model,
)


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
            version = register_final_model(mlflow_server, cfg, tr.run_id, model, score)
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
