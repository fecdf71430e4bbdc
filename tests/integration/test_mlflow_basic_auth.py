"""Credentials never printed, against a real MLflow server with basic auth (``mlflow server --app-name
basic-auth``, its admin user from ``MLFLOW_AUTH_ADMIN_USERNAME``/``_PASSWORD`` and its user store from the ini
that ``MLFLOW_AUTH_CONFIG_PATH`` names, as ``manifests/base/mlflow-deployment.yaml`` runs it).

A run's tracker logs through the password in the URI (``http://user:pw@host``) and through
``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` (the recommended form): params (``cfg.flat()``), tags,
metrics and the run's files (``config.yaml``, ``summary.json``, the curves) arrive, and none of them, nor stdout
(MLflow's run link) or the logs, holds the password. The server needs Flask-WTF (``mlflow[auth]``, the dev extra).
A wrong password is one error line naming neither password, from the tracker and from ``dockflow compare``
(exit 2), and ``dockflow compare`` through the URI shows it redacted. Redaction itself, the report and the S3 keys: ``tests/unit/test_redact.py``,
``tests/unit/storage/test_s3_store.py``."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.mlflow_server import MlflowServer, free_port
from mlflow.tracking import MlflowClient

from dockflow import cli
from dockflow.config import load_config
from dockflow.flow.final_model import log_artifacts, summary
from dockflow.flow.run_record import RunRecord
from dockflow.flow.run_setup import run_dir_of, write_run_config
from dockflow.redact import redact_config
from dockflow.tracking import Tracker, TrackingError
from dockflow.tracking.tags import run_tags

USER = "dockflow-admin"
SECRET = "Basic-Auth-S3cret-7c1e"
WRONG = "Wrong-Passw0rd-9f2a"
CRED_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def _with_password(url: str, password: str) -> str:
    return url.replace("http://", f"http://{USER}:{password}@", 1)


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """One basic-auth MLflow server on a free loopback port, its admin ``USER``/``SECRET``; stopped at the end."""
    root = tmp_path_factory.mktemp("mlflow_basic_auth")
    ini = root / "basic_auth.ini"
    ini.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{root / 'basic_auth.db'}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        "auth_cache_ttl_seconds = 60\n"  # one PBKDF2 check per password, not one per request
    )
    env = {"MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_AUTH_ADMIN_USERNAME": USER,
           "MLFLOW_AUTH_ADMIN_PASSWORD": SECRET, "MLFLOW_FLASK_SERVER_SECRET_KEY": "csrf-key-for-tests"}
    server = MlflowServer(root, free_port(), args=("--app-name", "basic-auth"), env=env)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def no_cred_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in CRED_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _admin_client(url: str, monkeypatch: pytest.MonkeyPatch) -> MlflowClient:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    return MlflowClient(url)


@pytest.mark.parametrize("form", ["uri", "env"])
def test_a_run_logs_through_basic_auth_and_shows_no_password(
    form: str, auth_server: MlflowServer, tmp_path: Path, no_cred_env: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture,
) -> None:
    if form == "uri":
        uri = _with_password(auth_server.url, SECRET)
    else:
        uri = auth_server.url
        no_cred_env.setenv("MLFLOW_TRACKING_USERNAME", USER)
        no_cred_env.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    # model.path and a pointer tag carry the password too: a URI anywhere in params or tags is redacted.
    cfg = load_config(None, [f"tracking.uri={uri}", f"run.output_dir={tmp_path}", f"run.name=auth-{form}",
                             "tracking.experiment=basic-auth", f"model.path={_with_password('http://hub/m', SECRET)}"])
    run_dir = run_dir_of(cfg)
    write_run_config(cfg, run_dir)  # what trainer.train does, then Tracker.start with the same arguments
    tags = run_tags(cfg.algorithm.name, cfg.model.path, cfg.dock.backend, cfg.run.name)
    rec = RunRecord(iteration=1, evals=[(1, {"eval/test_accuracy": 0.5})],
                    history=[{"reward/mean": 0.25, "perf/throughput_tps": 9.0, "timing/iteration_s": 1.0}])
    with caplog.at_level(logging.INFO), Tracker.start(cfg.tracking, cfg.run.output_dir, cfg.run.name,
                                                      params=cfg.flat(), tags=tags) as tr:
        tr.log_metrics({"reward/mean": 0.25}, step=1)
        (run_dir / "summary.json").write_text(json.dumps(redact_config(summary(cfg, rec, tr.run_id, 1.0))))
        tr.set_tags({"checkpoint_uri": _with_password("http://store/ckpt", SECRET)})  # as final_model.finish
        log_artifacts(tr, run_dir, rec)

    client = _admin_client(auth_server.url, no_cred_env)
    run = client.get_run(tr.run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["reward/mean"] == 0.25
    params, run_tag_values = run.data.params, run.data.tags
    assert len(params) == len(cfg.flat()) and run_tag_values["algorithm"] == cfg.algorithm.name
    shown = _with_password(auth_server.url, "***") if form == "uri" else auth_server.url
    assert params["tracking.uri"] == shown
    assert params["model.path"] == run_tag_values["model"] == f"http://{USER}:***@hub/m"
    assert run_tag_values["checkpoint_uri"] == f"http://{USER}:***@store/ckpt"
    leaks = {k: v for k, v in {**params, **run_tag_values}.items() if SECRET in v}
    assert not leaks, f"the password is in params/tags {sorted(leaks)}"
    logged = sorted(a.path for a in client.list_artifacts(tr.run_id))
    assert logged == ["config.yaml", "curves.png", "summary.json"]
    for name in logged:
        data = Path(client.download_artifacts(tr.run_id, name, str(tmp_path / "dl"))).read_bytes()
        assert SECRET.encode() not in data, f"the password is in the artifact {name}"
    printed = capsys.readouterr()
    assert SECRET not in caplog.text + printed.out + printed.err
    # MLflow prints the run's link when it ends; with the password in the URI, dockflow prints it redacted.
    assert f"{shown}/#/experiments/{run.info.experiment_id}/runs/{tr.run_id}" in printed.out
    for as_json in ([], ["--json"]):  # dockflow compare names the store in its table's title and its JSON
        assert cli.main(["compare", cfg.run.name, "--tracking-uri", uri, *as_json]) == 0
        compared = capsys.readouterr().out
        assert tr.run_id in compared and SECRET not in compared
    assert cfg.tracking.uri == uri  # the run itself keeps the real value


def _one_line_without_passwords(text: str) -> None:
    assert len(text.strip().splitlines()) == 1, text
    assert SECRET not in text and WRONG not in text, text


def test_a_wrong_password_is_one_line_without_it(
    auth_server: MlflowServer, tmp_path: Path, no_cred_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = load_config(None, [f"tracking.uri={_with_password(auth_server.url, WRONG)}", "tracking.experiment=nope"])
    with pytest.raises(TrackingError) as uri_form:
        Tracker.start(cfg.tracking, tmp_path, "wrong-uri")
    _one_line_without_passwords(str(uri_form.value))
    assert f"MLflow at http://{USER}:***@127.0.0.1:{auth_server.port} refused the credentials (UNAUTHENTICATED" \
        in str(uri_form.value) and "401" in str(uri_form.value) and "MLFLOW_TRACKING_PASSWORD" in str(uri_form.value)

    no_cred_env.setenv("MLFLOW_TRACKING_USERNAME", USER)
    no_cred_env.setenv("MLFLOW_TRACKING_PASSWORD", WRONG)
    with pytest.raises(TrackingError) as env_form:
        Tracker.start(load_config(None, [f"tracking.uri={auth_server.url}"]).tracking, tmp_path, "wrong-env")
    _one_line_without_passwords(str(env_form.value))
    assert "refused the credentials" in str(env_form.value)

    assert cli.main(["compare", "any-run", "--tracking-uri", _with_password(auth_server.url, WRONG)]) == 2
    out = capsys.readouterr()
    assert out.err.startswith("dockflow compare: error: MLflow at ") and "refused the credentials" in out.err
    assert out.out == ""
    _one_line_without_passwords(out.err)
    assert SECRET not in caplog.text and WRONG not in caplog.text
