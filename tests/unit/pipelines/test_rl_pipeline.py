"""The compiled RL pipeline: tasks per iteration, staleness edges, the exit handler, and per-task platform config."""

from pathlib import Path

import pytest
import yaml

from pipelines import platform
from pipelines.launch import compile_pipeline
from pipelines.rl_pipeline import PipelineOptions

STAGES = ("generate", "infer", "update", "reshard")


_COMPILED: dict[str, str] = {}  # compiling takes seconds: each variant once per session


def compiled(tmp_path: Path, **opts) -> tuple[dict, dict]:
    options = PipelineOptions(**opts)
    key = repr(options)
    if key not in _COMPILED:
        _COMPILED[key] = compile_pipeline(options, tmp_path / "p.yaml").read_text()
    spec, platform_spec = yaml.safe_load_all(_COMPILED[key])
    return spec, platform_spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def body(spec: dict) -> dict[str, dict]:
    """Tasks inside the exit handler, keyed by display name (generate-0, ...)."""
    handler = next(c for name, c in spec["components"].items() if name.startswith("comp-exit-handler"))
    return {t["taskInfo"]["name"]: t for t in handler["dag"]["tasks"].values()}


def deps(spec: dict) -> dict[str, set[str]]:
    handler = next(c for name, c in spec["components"].items() if name.startswith("comp-exit-handler"))
    tasks = handler["dag"]["tasks"]
    display = {tid: t["taskInfo"]["name"] for tid, t in tasks.items()}
    return {display[tid]: {display[d] for d in t.get("dependentTasks", [])} for tid, t in tasks.items()}


@pytest.mark.parametrize("iterations", [1, 3])
def test_every_iteration_has_its_four_stages_and_evaluations_at_the_ends(tmp_path, iterations):
    spec, _ = compiled(tmp_path, iterations=iterations)
    names = set(deps(spec))
    expected = {"setup", "evaluate-0", f"evaluate-{iterations}"}
    expected |= {f"{s}-{i}" for s in STAGES for i in range(iterations)}
    assert names == expected
    assert spec["pipelineInfo"]["name"] == "dockflow-rl"


def test_evaluation_interval_adds_evaluations_that_precede_the_next_update(tmp_path):
    d = deps(compiled(tmp_path, iterations=4, eval_every=2)[0])
    assert {n for n in d if n.startswith("evaluate")} == {"evaluate-0", "evaluate-2", "evaluate-4"}
    assert "reshard-1" in d["evaluate-2"] and "evaluate-2" in d["update-2"]
    assert "evaluate-0" in d["update-0"]


def test_staleness_zero_makes_each_generation_wait_for_the_previous_reshard(tmp_path):
    d = deps(compiled(tmp_path, iterations=3)[0])
    for i in (1, 2):
        assert f"reshard-{i - 1}" in d[f"generate-{i}"]
    assert d["infer-1"] >= {"generate-1"} and d["update-1"] >= {"infer-1", "reshard-0"}
    assert d["reshard-1"] >= {"update-1"}


def test_staleness_one_lets_generation_run_one_iteration_ahead(tmp_path):
    d = deps(compiled(tmp_path, iterations=3, max_staleness=1)[0])
    assert not any(n.startswith("reshard") for n in d["generate-1"])  # may overlap update-0
    assert "reshard-0" in d["generate-2"] and "reshard-1" not in d["generate-2"]
    assert "generate-1" in d["generate-2"]  # generations stay in order
    assert "reshard-1" in d["update-2"]  # and so do updates


def test_teardown_is_the_exit_handler_and_gets_the_final_status(tmp_path):
    spec, _ = compiled(tmp_path, iterations=1)
    root = spec["root"]["dag"]["tasks"]
    assert root["teardown"]["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert "exit-handler-1" in root["teardown"]["dependentTasks"]
    assert "taskFinalStatus" in root["teardown"]["inputs"]["parameters"]["status"]


def test_runtime_parameters_and_the_dag_overrides_reach_setup(tmp_path):
    spec, _ = compiled(tmp_path, iterations=2, max_staleness=1, eval_every=0)
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert set(params) == {"config", "overrides", "run_name", "ray_address", "mlflow_uri", "s3_endpoint", "s3_bucket", "image"}
    setup = body(spec)["setup"]["inputs"]["parameters"]
    dag = setup["dag_overrides"]["runtimeValue"]["constant"]
    assert dag == ["train.iterations=2", "train.max_staleness=1", "eval.every=0"]


def executor_of(spec: dict, display: str) -> str:
    task = body(spec)[display] if display != "teardown" else spec["root"]["dag"]["tasks"]["teardown"]
    comp = spec["components"][task["componentRef"]["name"]]
    return comp["executorLabel"]


def test_platform_config_gpu(tmp_path):
    spec, executors = compiled(tmp_path, iterations=1, accelerator="nvidia", accelerator_count=2,
                               node_selector={"pool": "rl"})
    deployment = spec["deploymentSpec"]["executors"]
    update = executor_of(spec, "update-0")
    resources = deployment[update]["container"]["resources"]
    assert resources["accelerator"]["resourceType"] == "nvidia.com/gpu"
    assert resources["accelerator"]["resourceCount"] == "2"
    assert executors[update]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert executors[update]["nodeSelector"]["labels"] == {"pool": "rl"}
    setup = executor_of(spec, "setup")
    assert "accelerator" not in deployment[setup]["container"].get("resources", {})  # Ray clients need no GPU
    for name in ("setup", "generate-0", "update-0", "teardown"):
        ex = executors[executor_of(spec, name)]
        secrets = {s["secretName"]: [k["envVar"] for k in s["keyToEnv"]] for s in ex["secretAsEnv"]}
        assert secrets == {platform.MINIO_SECRET: list(platform.MINIO_SECRET_ENV),
                           platform.MLFLOW_SECRET: list(platform.MLFLOW_SECRET_ENV)}
        config_maps = ex["configMapAsEnv"]
        assert config_maps[0]["configMapName"] == platform.ENDPOINTS_CONFIG_MAP
        assert [k["envVar"] for k in config_maps[0]["keyToEnv"]] == list(platform.COMPONENT_ENV)
        assert ex["emptyDirMounts"][0] == {"medium": "Memory", "mountPath": "/dev/shm", "sizeLimit": "2Gi", "volumeName": "dshm"}


def test_platform_config_ascend_and_cpu(tmp_path):
    spec, _ = compiled(tmp_path, iterations=1, accelerator="ascend")
    gen = spec["deploymentSpec"]["executors"][executor_of(spec, "generate-0")]
    assert gen["container"]["resources"]["accelerator"]["resourceType"] == "huawei.com/Ascend910"
    spec, executors = compiled(tmp_path, iterations=1)
    gen = executor_of(spec, "generate-0")
    assert "accelerator" not in spec["deploymentSpec"]["executors"][gen]["container"].get("resources", {})
    assert "tolerations" not in executors[gen]


def test_retries_only_where_a_rerun_is_safe_and_no_caching(tmp_path):
    spec, _ = compiled(tmp_path, iterations=1)
    tasks = body(spec)
    assert tasks["generate-0"]["retryPolicy"]["maxRetryCount"] == 2
    assert tasks["evaluate-1"]["retryPolicy"]["maxRetryCount"] == 2
    for name in ("setup", "infer-0", "update-0", "reshard-0"):
        assert "retryPolicy" not in tasks[name]  # a rerun would train twice or recreate the run
    assert all(t["cachingOptions"] == {} or not t["cachingOptions"].get("enableCache") for t in tasks.values())


@pytest.mark.parametrize(
    ("opts", "match"),
    [({"iterations": 0}, "iterations"), ({"iterations": 1, "max_staleness": -1}, "max_staleness"),
     ({"iterations": 1, "accelerator": "tpu"}, "accelerator")],
)
def test_bad_options_are_refused(opts, match):
    with pytest.raises(ValueError, match=match):
        PipelineOptions(**opts)
