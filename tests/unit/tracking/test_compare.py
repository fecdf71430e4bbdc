"""dockflow compare: runs resolved by id, name or experiment; differing params, final metrics, tags; errors."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from dockflow.cli import main
from dockflow.config import TrackingConfig
from dockflow.tracking import Tracker, TrackingError, run_tags
from dockflow.tracking.compare import compare_runs, print_comparison


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A file store (fast to create; MLflow 3.17 wants the opt-in) with runs a1, a2 in exp-a and b1 in exp-b."""
    root = tmp_path_factory.mktemp("mlruns")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        uri = root.as_uri()
        ids = {}
        for name, exp, lr, backend, rewards in [
            ("a1", "exp-a", 0.1, "distributed", [0.1, 0.4]),
            ("a2", "exp-a", 0.2, "centralized", [0.2, 0.5]),
            ("b1", "exp-b", 0.1, "distributed", [0.3]),
        ]:
            params = {"train.lr": lr, "run.seed": 0}
            tags = run_tags("grpo", None, backend, name) | {"dockflow.eval.fingerprint": f"fp-{exp}"}
            with Tracker.start(TrackingConfig(uri=uri, experiment=exp), root, name, params, tags) as tr:
                for step, r in enumerate(rewards, start=1):
                    tr.log_metrics({"reward/mean": r, "eval/test_accuracy": r / 2}, step=step)
            ids[name] = tr.run_id
        yield uri, ids


def test_resolves_ids_names_and_experiments(store: tuple[str, dict[str, str]]) -> None:
    uri, ids = store
    cmp = compare_runs([ids["a1"], "a2"], uri)
    assert [r["run_name"] for r in cmp["runs"]] == ["a1", "a2"]
    assert [r["experiment"] for r in cmp["runs"]] == ["exp-a", "exp-a"]
    assert cmp["params"] == {"train.lr": ["0.1", "0.2"]}  # run.seed is equal, so not shown
    assert cmp["metrics"]["reward/mean"] == [0.4, 0.5]  # the value at the last step
    assert cmp["metrics"]["eval/test_accuracy"] == [0.2, 0.25]
    assert cmp["metrics"]["perf/throughput_tps"] == [None, None]
    assert cmp["tags"]["dock_backend"] == ["distributed", "centralized"]
    assert cmp["tags"]["algorithm"] == ["grpo", "grpo"] and cmp["tags"]["model"] == ["tiny-qwen2"] * 2
    assert cmp["tags"]["dockflow.eval.fingerprint"] == ["fp-exp-a", "fp-exp-a"]  # scored on the same evaluation
    assert cmp["tags"]["dockflow.lineage.base_model"] == [None, None]

    both = compare_runs(["exp-b", "exp-a", "a1", ids["b1"]], uri, metrics=["reward/mean"])
    assert [r["run_name"] for r in both["runs"]] == ["b1", "a1", "a2"]  # duplicates dropped, order kept
    assert list(both["metrics"]) == ["reward/mean"]

    out = io.StringIO()
    print_comparison(cmp, Console(file=out, width=200))
    table = out.getvalue()
    for text in ("a1", "a2", "param train.lr", "0.2", "tag dock_backend", "centralized", "reward/mean", "0.5",
                 "tag dockflow.eval.fingerprint", "fp-exp-a"):
        assert text in table


def test_unknown_references_and_stores_are_one_clear_error(store: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    uri, _ = store
    with pytest.raises(TrackingError, match="'nope' is not a run id, run name or experiment name in file:"):
        compare_runs(["a1", "nope"], uri)
    with pytest.raises(TrackingError, match="does not exist"):
        compare_runs(["a1"], f"sqlite:///{tmp_path / 'missing.db'}")
    assert not (tmp_path / "missing.db").exists()


def test_cli_compare_json_and_errors(
    store: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    uri, ids = store
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert main(["compare", "exp-a", "--tracking-uri", uri, "--metrics", "reward/mean", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in got["runs"]] == [ids["a1"], ids["a2"]]
    assert got["metrics"] == {"reward/mean": [0.4, 0.5]}

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["compare", "a1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "dockflow compare: error: no tracking store given: pass --tracking-uri (http://host:5000, "
        "sqlite:///runs/<run>/mlflow.db) or set MLFLOW_TRACKING_URI"
    ]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again below: nothing listens there
    assert main(["compare", "a1", "--tracking-uri", dead]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"dockflow compare: error: MLflow tracking server {dead} failed")
