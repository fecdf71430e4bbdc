"""The compiled RL pipeline: a DAG of constant size (setup, five stage tasks, finish, teardown) whose length,
staleness bound and cadences are run-time parameters; per-task platform config; retries."""

import time
from pathlib import Path

import pytest
import yaml

from pipelines import platform
from pipelines.launch import compile_pipeline
from pipelines.rl_pipeline import PipelineOptions

STAGES = ("generate", "infer", "update", "reshard", "evaluate")
_COMPILED: dict[str, tuple[str, float]] = {}  # compiling takes seconds: each variant once per session


def compiled(tmp_path: Path, **opts) -> tuple[dict, dict, str, float]:
    options = PipelineOptions(**opts)
    key = repr(options)
    if key not in _COMPILED:
        start = time.perf_counter()
        text = compile_pipeline(options, tmp_path / "p.yaml").read_text()
        _COMPILED[key] = (text, time.perf_counter() - start)
    text, seconds = _COMPILED[key]
    spec, platform_spec = yaml.safe_load_all(text)
    return spec, platform_spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"], text, seconds


def handler(spec: dict) -> dict[str, dict]:
    """Tasks inside the exit handler, keyed by display name."""
    dag = next(c for name, c in spec["components"].items() if name.startswith("comp-exit-handler"))["dag"]
    return {t["taskInfo"]["name"]: t for t in dag["tasks"].values()}


def deps(spec: dict) -> dict[str, set[str]]:
    dag = next(c for name, c in spec["components"].items() if name.startswith("comp-exit-handler"))["dag"]
    display = {tid: t["taskInfo"]["name"] for tid, t in dag["tasks"].items()}
    return {display[tid]: {display[d] for d in t.get("dependentTasks", [])} for tid, t in dag["tasks"].items()}


def test_one_small_pipeline_serves_every_run_length(tmp_path):
    spec, _, text, seconds = compiled(tmp_path)
    tasks = handler(spec)
    assert set(tasks) == {"setup", *STAGES, "finish"}
    dags = [c for c in spec["components"].values() if "dag" in c] + [spec["root"]]
    assert sum(len(d["dag"]["tasks"]) for d in dags) <= 20  # the root's teardown and exit handler included
    assert len(text.encode()) < 200_000 and seconds < 15
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert {"iterations", "max_staleness", "eval_every", "checkpoint_every", "continue_from", "run_name"} <= set(params)
    assert params["iterations"]["parameterType"] == "NUMBER_INTEGER" and params["iterations"]["defaultValue"] == 600
    assert params["continue_from"]["defaultValue"] == "base" and params["run_name"]["defaultValue"] == ""
    big = compiled(tmp_path, iterations=100_000)[2]
    assert abs(len(big) - len(text)) < 16  # only the default differs


def test_stage_tasks_run_side_by_side_after_setup_and_finish_waits_for_all(tmp_path):
    d = deps(compiled(tmp_path)[0])
    for stage in STAGES:
        assert d[stage] == {"setup"}  # no edge between stages: they meet in the dock
    assert d["finish"] == {"setup", *STAGES}


def test_run_time_parameters_reach_setup_and_the_kfp_run_id_names_the_run(tmp_path):
    spec = compiled(tmp_path)[0]
    setup_params = handler(spec)["setup"]["inputs"]["parameters"]
    for name in ("iterations", "max_staleness", "eval_every", "checkpoint_every", "continue_from", "run_name"):
        assert setup_params[name]["componentInputParameter"] == f"pipelinechannel--{name}"  # the root parameter
    assert setup_params["job_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"
    teardown = spec["root"]["dag"]["tasks"]["teardown"]["inputs"]["parameters"]
    assert teardown["job_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"


def test_teardown_is_the_exit_handler_and_gets_the_final_status(tmp_path):
    spec = compiled(tmp_path)[0]
    root = spec["root"]["dag"]["tasks"]
    assert root["teardown"]["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert "exit-handler-1" in root["teardown"]["dependentTasks"]
    assert "taskFinalStatus" in root["teardown"]["inputs"]["parameters"]["status"]


def executor_of(spec: dict, display: str) -> str:
    task = handler(spec)[display] if display != "teardown" else spec["root"]["dag"]["tasks"]["teardown"]
    return spec["components"][task["componentRef"]["name"]]["executorLabel"]


def test_platform_config_no_accelerators_secrets_endpoints_and_labels(tmp_path):
    spec, executors, _, _ = compiled(tmp_path, node_selector={"pool": "rl"})
    deployment = spec["deploymentSpec"]["executors"]
    for name in ("setup", *STAGES, "finish", "teardown"):
        label = executor_of(spec, name)
        assert "accelerator" not in deployment[label]["container"].get("resources", {})  # devices: the Ray cluster's
        ex = executors[label]
        secrets = {s["secretName"]: [k["envVar"] for k in s["keyToEnv"]] for s in ex["secretAsEnv"]}
        assert secrets == {name: list(keys) for name, keys in platform.CLIENT_SECRETS.items()}
        assert secrets[platform.RAY_SECRET] == ["RAY_AUTH_TOKEN"]  # Ray token auth: the token of every client
        assert ex["podMetadata"]["labels"] == platform.TASK_POD_LABELS  # what the NetworkPolicies admit
        assert ex["configMapAsEnv"][0]["configMapName"] == platform.ENDPOINTS_CONFIG_MAP
        assert [k["envVar"] for k in ex["configMapAsEnv"][0]["keyToEnv"]] == list(platform.COMPONENT_ENV)
        assert ex["nodeSelector"]["labels"] == {"pool": "rl"}
    assert deployment[executor_of(spec, "setup")]["container"]["resources"]["resourceCpuRequest"] == "2"  # SFT
    assert deployment[executor_of(spec, "update")]["container"]["resources"]["resourceCpuRequest"] == "250m"


def test_every_task_but_setup_retries_and_nothing_is_cached(tmp_path):
    tasks = handler(compiled(tmp_path)[0])
    for name in (*STAGES, "finish"):
        assert tasks[name]["retryPolicy"]["maxRetryCount"] == 2  # a retry re-attaches (or restarts the run)
    assert "retryPolicy" not in tasks["setup"]  # a second setup would end the first attempt's run
    assert all(not t["cachingOptions"].get("enableCache") for t in tasks.values())


@pytest.mark.parametrize(
    ("opts", "match"),
    [({"iterations": 0}, "iterations"), ({"max_staleness": -1}, "max_staleness"), ({"retries": -1}, "retries")],
)
def test_bad_options_are_refused(opts, match):
    with pytest.raises(ValueError, match=match):
        PipelineOptions(**opts)
