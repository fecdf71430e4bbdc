"""Side-by-side comparison of MLflow runs: tags (the evaluation's fingerprint and the lineage among them: runs
whose fingerprints differ were scored on different evaluations), final key metrics, and the params that differ.

Each reference is resolved, in this order, as a run id, a run name (every run with that name), or an
experiment name (all of its runs); duplicates are dropped. A metric's "final" value is the one MLflow keeps
as latest: the value at the highest step.

    cmp = compare_runs(["grpo_arith", "3f2a..."], "sqlite:///runs/mlflow.db")
    print_comparison(cmp)                      # a rich table; json.dumps(cmp) for machines
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from rich.console import Console
from rich.table import Table

from dockflow.redact import redact_text
from dockflow.tracking.store import TrackingError, apply_http_env_defaults, explain, require_existing_store
from dockflow.tracking.tags import IDENTITY_KEYS, TAG_KEYS

DEFAULT_METRICS = ("eval/test_accuracy", "reward/mean", "perf/throughput_tps", "timing/iteration_s")
_NOT_A_RUN_ID = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")


def compare_uri(uri: str | None) -> str:
    """``uri``, else ``$MLFLOW_TRACKING_URI``; the store must exist (a typo must not create an empty one)."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise TrackingError(
            "no tracking store given: pass --tracking-uri (http://host:5000, sqlite:///runs/<run>/mlflow.db) "
            "or set MLFLOW_TRACKING_URI"
        )
    require_existing_store(uri)
    return uri


def _quoted(text: str) -> str:
    return f'"{text}"' if "'" in text else f"'{text}'"


def _resolve(client: MlflowClient, ref: str, experiments: dict[str, str]) -> list[Run]:
    try:
        return [client.get_run(ref)]
    except MlflowException as exc:
        if exc.error_code not in _NOT_A_RUN_ID:
            raise
    by_name = client.search_runs(
        list(experiments), filter_string=f"attributes.run_name = {_quoted(ref)}", order_by=["attributes.start_time ASC"]
    )
    if by_name:
        return list(by_name)
    exp = next((i for i, name in experiments.items() if name == ref), None)
    if exp is None:
        raise TrackingError(f"'{ref}' is not a run id, run name or experiment name in {client.tracking_uri}")
    runs = client.search_runs([exp], order_by=["attributes.start_time ASC"])
    if not runs:
        raise TrackingError(f"experiment '{ref}' in {client.tracking_uri} has no runs")
    return list(runs)


def find_runs(uri: str, refs: Sequence[str]) -> tuple[list[Run], dict[str, str]]:
    """The runs ``refs`` name (see module doc), in order, and ``{experiment_id: name}``."""
    if not refs:
        raise TrackingError("name at least one run id, run name or experiment name to compare")
    apply_http_env_defaults()
    client = MlflowClient(tracking_uri=uri)
    try:
        experiments = {e.experiment_id: e.name for e in client.search_experiments()}
        runs: dict[str, Run] = {}
        for ref in refs:
            for run in _resolve(client, ref, experiments):
                runs.setdefault(run.info.run_id, run)
    except TrackingError:
        raise
    except Exception as exc:  # connection errors come as MlflowException, requests or OSError
        raise explain(uri, exc) from exc
    return list(runs.values()), experiments


def compare_runs(refs: Sequence[str], uri: str | None = None, metrics: Sequence[str] = DEFAULT_METRICS) -> dict[str, Any]:
    """``{"tracking_uri", "runs", "tags", "metrics", "params"}``; tags/metrics/params map a key to one value per
    run (None where a run lacks it), params only where the runs differ. Tags: ``TAG_KEYS`` and the identity
    tags (``dockflow.eval.fingerprint``, ``dockflow.lineage.task``, ``dockflow.lineage.base_model``). For
    display: ``tracking_uri`` has its password hidden (``dockflow.redact``)."""
    uri = compare_uri(uri)
    runs, experiments = find_runs(uri, refs)
    all_params = sorted({k for r in runs for k in r.data.params})
    params = {k: [r.data.params.get(k) for r in runs] for k in all_params}
    return {
        "tracking_uri": redact_text(uri),
        "runs": [
            {
                "run_id": r.info.run_id,
                "run_name": r.info.run_name,
                "experiment": experiments.get(r.info.experiment_id, r.info.experiment_id),
                "status": r.info.status,
            }
            for r in runs
        ],
        "tags": {k: [r.data.tags.get(k) for r in runs] for k in (*TAG_KEYS, *IDENTITY_KEYS)},
        "metrics": {k: [r.data.metrics.get(k) for r in runs] for k in metrics},
        "params": {k: v for k, v in params.items() if len(set(v)) > 1},
    }


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.5g}"
    return str(value)


def print_comparison(cmp: dict[str, Any], console: Console | None = None) -> None:
    """One column per run; rows: run facts, tags, final metrics, differing params."""
    console = console or Console()
    table = Table(title=f"DockFlow runs in {cmp['tracking_uri']}")
    table.add_column("")
    for r in cmp["runs"]:
        table.add_column(str(r["run_name"]), overflow="fold")
    for key in ("run_id", "experiment", "status"):
        table.add_row(key, *[_cell(r[key]) for r in cmp["runs"]])
    table.add_section()
    for key, values in cmp["tags"].items():
        table.add_row(f"tag {key}", *[_cell(v) for v in values])
    table.add_section()
    for key, values in cmp["metrics"].items():
        table.add_row(key, *[_cell(v) for v in values])
    table.add_section()
    for key, values in cmp["params"].items():
        table.add_row(f"param {key}", *[_cell(v) for v in values])
    if not cmp["params"]:
        table.add_row("params", *["(all equal)"] * len(cmp["runs"]))
    console.print(table)
