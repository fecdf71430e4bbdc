"""The Kubeflow pipeline end to end under kfp.local, on one shared local Ray cluster, the test S3 server (moto) and
one MLflow tracking server:

- a run whose model and data come only from s3:// (their local copies are deleted first; SFT's warm start is
  staged to S3 and the workers load it from there) loses one of its stage tasks to SIGKILL mid-run; KFP's retry
  re-attaches and the run finishes with every sample trained once;
- the same run, started under its own name in another process that is killed mid-way, resubmitted with that
  name: the earlier attempt's live actors are ended, the run resumes from its S3 checkpoint in the same MLflow
  run; mid-way its supervisor is killed too and Ray restarts it (``max_restarts``): it resumes from its latest
  checkpoint, the attached stage task re-attaches by itself (no KFP retry), and the final weights equal the
  uninterrupted run's bit for bit (max_staleness 0);
- two recurring runs with no run name: different names, namespaces, checkpoint prefixes and MLflow runs; the
  second starts from the first's registered champion (one lineage), is scored on fewer prompts (another
  evaluation: its actor re-scores the champion on it, as the run's evaluation would), registers its own version
  and, not beating the champion by the margin, leaves the alias where it was.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import ray
from mlflow import MlflowClient
from safetensors.torch import load_file

from dockflow.config import load_config
from dockflow.data import load_task
from dockflow.eval import EvalInputs, evaluate_policy
from dockflow.flow.run_checkpoint import read_record
from dockflow.models import load_model_and_tokenizer
from dockflow.storage import run_store
from dockflow.storage.objects import fetch_model, stage_model
from dockflow.tracking import read_metric_history
from dockflow.workers.resources import build_plan
from pipelines.launch import options_for, run_local

pytestmark = pytest.mark.slow
CONFIG = "configs/grpo_arith.yaml"
STAGES = ("generate", "infer", "update", "reshard", "evaluate")


@pytest.fixture(scope="module")
def cluster(s3_server, mlflow_server, tmp_path_factory):
    """One local Ray cluster for the module, started with the S3 keys in its environment (the workers read them)."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in s3_server.env().items():
            mp.setenv(key, value)
        mp.setenv("DOCKFLOW_CACHE_DIR", str(tmp_path_factory.mktemp("worker_cache")))
        ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="test-pipeline")
        try:
            yield ray.get_runtime_context().gcs_address
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def s3_inputs(cluster, s3_server, tmp_path_factory):
    """A tiny model and the task's JSONL files uploaded to S3; the local copies are deleted."""
    from dockflow.data import generate_arithmetic
    from dockflow.models import build_tiny_model, save_pretrained_dir
    from dockflow.models.tokenizer import build_task_tokenizer

    local = tmp_path_factory.mktemp("inputs")
    cfg = load_config(CONFIG, ["data.arithmetic.digits=1", "data.arithmetic.ops=[+]", "data.arithmetic.num_train=60",
                               "data.arithmetic.num_labeled=60", "data.arithmetic.num_val=20",
                               "data.arithmetic.num_test=20"])  # the tiny task of conftest.TINY_RUN
    task = generate_arithmetic(cfg.data.arithmetic, 0)
    root = f"s3://{s3_server.BUCKET}/inputs"
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint, aws_access_key_id=s3_server.access_key,
                      aws_secret_access_key=s3_server.secret_key, region_name=s3_server.region)
    for name, rows in (("train", task.val + task.train), ("test", task.test)):
        body = "".join(json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n" for e in rows)
        s3.put_object(Bucket=s3_server.BUCKET, Key=f"inputs/{name}.jsonl", Body=body.encode())
    tok = build_task_tokenizer(cfg.data, cfg.run.seed, cfg.model.tiny.tokenizer_merges, cfg.checkpoint)
    model_dir = save_pretrained_dir(build_tiny_model(cfg.model.tiny, tok, seed=0), tok, local / "tiny")
    stage_model(model_dir, f"{root}/tiny", cfg.checkpoint)
    for path in sorted(local.rglob("*"), reverse=True):  # nothing of the inputs stays on this disk
        path.unlink() if path.is_file() else path.rmdir()
    return root


S3_RUN_ITERATIONS = 20  # checkpoints every 4: a stage task is killed between checkpoints 4 and 12, the supervisor
# after its attempt's first iteration and before iteration 16 (16 iterations left too narrow a window for both)


def s3_run(tiny_overrides, s3_server, s3_inputs, mlflow_server, iterations: int) -> list[str]:
    extra = {
        "model__path": f"{s3_inputs}/tiny", "data__source": "file", "data__train_path": f"{s3_inputs}/train.jsonl",
        "data__test_path": f"{s3_inputs}/test.jsonl", "checkpoint__dir": f"s3://{s3_server.BUCKET}/pipeline-ckpt",
        "tracking__uri": mlflow_server, "registry__model_name": "null", "eval__every": 10,
        "dock__backend": "centralized", "fault_tolerance__attach_grace_s": 600, "checkpoint__every": 4,
    }
    return tiny_overrides("s3run", iterations, **extra)


def kill_one_stage_task_mid_run(cfg, killed: list[str]) -> None:
    """SIGKILL the first stage task's process once the run is a few iterations in (not near its end)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not killed:
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if "kfp.dsl.executor_main" in cmd and "--function_to_execute" in cmd:
                stage = cmd[cmd.index("--function_to_execute") + 1]
                latest = run_store(cfg.checkpoint, cfg.run).latest() or 0
                if stage in STAGES and 4 <= latest < cfg.train.iterations - 8:
                    proc.send_signal(signal.SIGKILL)
                    killed.append(stage)
                    return
        time.sleep(0.2)


def kill_the_supervisor_mid_run(cfg, old_id: str, out: dict) -> None:
    """``ray.kill`` (Ray restarts it) the run's supervisor once this attempt's has closed an iteration, not near the
    end; time until the restarted one (another process) runs the loops again and until it closes an iteration."""
    name, namespace = f"{cfg.run.name}-supervisor", f"dockflow-{cfg.run.name}"

    def pid_and_status(sup) -> tuple[int, dict]:
        try:
            return ray.get(sup.__ray_call__.remote(lambda self: (os.getpid(), self.status())), timeout=10)
        except ray.exceptions.RayError:  # restarting
            return 0, {}

    start, deadline = None, time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            sup = ray.get_actor(name, namespace=namespace)
        except ValueError:
            sup = None
        pid, status = pid_and_status(sup) if sup is not None and sup._actor_id.hex() != old_id else (0, {})
        if status.get("phase") == "running":
            start = status["iteration"] if start is None else start
            if start < status["iteration"] < cfg.train.iterations - 4:
                out["killed_at"] = run_store(cfg.checkpoint, cfg.run).latest() or 0
                killed = time.monotonic()
                ray.kill(sup, no_restart=False)
                break
        time.sleep(0.2)
    else:
        return
    resumed_at = None
    while time.monotonic() - killed < 300:
        new_pid, status = pid_and_status(sup)
        if new_pid not in (0, pid) and status["phase"] == "running":
            if resumed_at is None:
                resumed_at, out["running_s"] = status["iteration"], time.monotonic() - killed
            elif status["iteration"] > resumed_at:
                out["first_iteration_s"] = time.monotonic() - killed
                return
        time.sleep(0.1)


def weights(model_uri: str, cfg) -> dict:
    return load_file(str(fetch_model(model_uri, cfg.checkpoint) / "model.safetensors"))


@pytest.mark.chaos  # 280 s: three pipeline runs with kills; `make test-chaos` (the worker kills stay in `make test`)
def test_s3_run_survives_a_killed_stage_task_and_a_resumed_run_matches_it_bit_for_bit(
    cluster, s3_inputs, s3_server, mlflow_server, tiny_overrides, tmp_path
):
    overrides = s3_run(tiny_overrides, s3_server, s3_inputs, mlflow_server, S3_RUN_ITERATIONS)
    options = options_for(load_config(CONFIG, overrides), CONFIG)
    quick = type(options)(**{**options.__dict__, "retry_backoff_s": 1})

    # Uninterrupted, except that one stage task is killed mid-run: its retry re-attaches to the live loop.
    cfg = load_config(CONFIG, [*overrides, "run.name=uninterrupted"])
    killed: list[str] = []
    killer = threading.Thread(target=kill_one_stage_task_mid_run, args=(cfg, killed), daemon=True)
    killer.start()
    full = run_local(CONFIG, overrides, cfg, options=quick, run_name="uninterrupted")
    killer.join(timeout=5)
    assert killed, "no stage task was killed mid-run"
    assert full["iterations"] == S3_RUN_ITERATIONS and full["samples_trained"] == S3_RUN_ITERATIONS * build_plan(cfg).train_batch
    assert full["restarts"] == 0 and full["resumed_from"] == 0  # the loops never stopped: only a task's process died
    assert full["initial_model"].startswith("s3://") and full["final_model"].startswith("s3://")
    history = read_metric_history(mlflow_server, full["mlflow_run_id"], "train/samples")
    assert [s for s, _ in history] == list(range(1, S3_RUN_ITERATIONS + 1))

    # A second attempt in another process, killed mid-way; its supervisor lives on in the shared cluster.
    resumed_cfg = load_config(CONFIG, [*overrides, "run.name=resubmitted"])
    cmd = [sys.executable, "-m", "dockflow.cli", "pipeline", "run", "--local", "--config", CONFIG, *overrides,
           f"ray.address={cluster}", f"run.output_dir={tmp_path / 'killed'}", "--run-name", "resubmitted"]
    first = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while (run_store(resumed_cfg.checkpoint, resumed_cfg.run).latest() or 0) < 4:
        assert first.poll() is None and time.monotonic() < deadline, "the first attempt ended before its checkpoint"
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    store = run_store(resumed_cfg.checkpoint, resumed_cfg.run)
    first_run_id = read_record(store, store.latest()).mlflow_run_id
    old_supervisor = ray.get_actor("resubmitted-supervisor", namespace="dockflow-resubmitted")  # still alive

    # Resubmitted; its own supervisor is killed mid-run and restarted by Ray. No task retries: the attached stage
    # task must re-attach to the restarted supervisor by itself.
    chaos: dict = {}
    killer = threading.Thread(target=kill_the_supervisor_mid_run,
                              args=(resumed_cfg, old_supervisor._actor_id.hex(), chaos), daemon=True)
    killer.start()
    no_retries = type(options)(**{**options.__dict__, "retries": 0})
    resumed = run_local(CONFIG, overrides, resumed_cfg, options=no_retries, run_name="resubmitted")
    killer.join(timeout=5)
    assert "killed_at" in chaos, "the supervisor was not killed mid-run"
    print(f"supervisor killed after checkpoint {chaos['killed_at']}: loops running again after "
          f"{chaos.get('running_s', -1):.1f}s, next iteration closed after {chaos.get('first_iteration_s', -1):.1f}s")
    assert chaos["running_s"] < 120, chaos
    assert resumed["restarts"] == 1 and resumed["resumed_from"] >= chaos["killed_at"], (resumed["restarts"], chaos)
    assert resumed["mlflow_run_id"] == first_run_id and resumed["samples_trained"] == S3_RUN_ITERATIONS * build_plan(cfg).train_batch
    assert 4 <= resumed["resumed_from"] < S3_RUN_ITERATIONS, resumed["resumed_from"]
    assert resumed["reward_per_iteration"] == full["reward_per_iteration"]
    a, b = weights(full["final_model"], cfg), weights(resumed["final_model"], cfg)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a), "the resumed run's weights differ"


def test_recurring_runs_build_on_the_champion_with_their_own_identity(cluster, mlflow_server, tiny_overrides, tmp_path):
    model_name = f"nightly-{os.getpid()}"
    base = tiny_overrides("nightly", 2, tracking__uri=mlflow_server, registry__model_name=model_name,
                          dock__backend="centralized", checkpoint__dir=str(tmp_path / "ckpt"))
    cfg = load_config(CONFIG, base)
    first = run_local(CONFIG, base, cfg, continue_from="base")
    # held-out accuracy cannot beat it by more than 1; scored on fewer prompts, another evaluation: the gate has
    # the actor re-score the champion on it
    second_overrides = [*base, "registry.champion_margin=1.0", "eval.num_prompts=12"]
    second_cfg = load_config(CONFIG, second_overrides)
    second = run_local(CONFIG, second_overrides, second_cfg, continue_from="champion")

    names = {first["run_name"], second["run_name"]}
    assert len(names) == 2 and all(n.startswith("nightly-") for n in names)  # named after their KFP run ids
    assert first["checkpoints"] != second["checkpoints"] and first["mlflow_run_id"] != second["mlflow_run_id"]
    client = MlflowClient(mlflow_server)
    assert {client.get_run(r["mlflow_run_id"]).info.run_name for r in (first, second)} == names  # and Ray namespaces

    start, champion = weights(second["initial_model"], cfg), weights(first["final_model"], cfg)
    assert all((start[k] == champion[k]).all() for k in champion), "the second run did not start from the champion"
    assert first["registry"]["champion_moved"] and first["registry"]["version"] == 1
    assert second["registry"]["version"] == 2 and not second["registry"]["champion_moved"]
    assert client.get_model_version_by_alias(model_name, "champion").version == "1"
    for run, moved in ((first, 1.0), (second, 0.0)):
        assert [v for _, v in read_metric_history(mlflow_server, run["mlflow_run_id"], "registry/champion_moved")] == [moved]
        assert client.get_run(run["mlflow_run_id"]).info.status == "FINISHED"
    # one lineage along the chain (the second run's base model is the champion's own); two evaluations, so the
    # champion was re-scored on the second's by its actor, with the code and examples of the run's evaluation
    first_fp, second_fp = first["evaluation"]["fingerprint"], second["evaluation"]["fingerprint"]
    assert first_fp != second_fp and second["evaluation"]["num_prompts"] == "12"
    assert second["lineage"] == first["lineage"] and first["lineage"]["base_model"].startswith("tiny qwen2")
    reg = second["registry"]
    assert (reg["comparison"], reg["fingerprint"], reg["champion_fingerprint"], reg["compared_on"]) == (
        "rescored", second_fp, first_fp, second_fp)
    model, tok = load_model_and_tokenizer(fetch_model(first["final_model"], cfg.checkpoint))
    test = load_task(second_cfg.data, second_cfg.run.seed).test[:12]
    scoring = EvalInputs(second_cfg.eval, second_cfg.data, second_cfg.rollout.max_new_tokens, second_cfg.run.seed)
    assert reg["compared_score"] == evaluate_policy(model, tok, test, scoring)["eval/test_accuracy"]
    for run, version, fingerprint in ((first, "1", first_fp), (second, "2", second_fp)):
        run_tags, mv = client.get_run(run["mlflow_run_id"]).data.tags, client.get_model_version(model_name, version)
        assert run_tags["dockflow.eval.fingerprint"] == mv.tags["dockflow.eval.fingerprint"] == fingerprint
        assert mv.tags["dockflow.lineage.base_model"] == run_tags["dockflow.lineage.base_model"] == first["lineage"]["base_model"]
        assert run_tags["registry.compared"] == run["registry"]["compared"] and run["registry"]["decision"] in mv.description


def test_a_run_no_task_attaches_to_stops_itself(cluster, mlflow_server, tiny_overrides):
    """KFP terminated the run before any stage task attached (its exit handler did not run either): no iteration
    runs unobserved, and after ``fault_tolerance.attach_grace_s`` the MLflow run is KILLED and the run's actors
    are gone."""
    from dockflow.flow.pipeline_tasks import RunParams, setup

    overrides = tiny_overrides("orphan", 200, tracking__uri=mlflow_server, dock__backend="centralized",
                               fault_tolerance__attach_grace_s=3)
    info = setup(CONFIG, overrides, RunParams(job_id="orphan01"), cluster)
    assert info["run_name"] == "orphan-orphan01" and info["namespace"] == "dockflow-orphan-orphan01"
    deadline = time.monotonic() + 120
    while True:
        try:
            ray.get_actor("orphan-orphan01-supervisor", namespace=info["namespace"])
        except ValueError:
            break
        assert time.monotonic() < deadline, "the abandoned run's supervisor is still alive"
        time.sleep(0.5)
    with pytest.raises(ValueError):
        ray.get_actor("orphan-orphan01-actor", namespace=info["namespace"])  # the workers died with it
    run = MlflowClient(mlflow_server).get_run(info["mlflow_run_id"])
    assert run.info.status == "KILLED"
    assert "train/samples" not in run.data.metrics  # the loops wait for a stage task to attach
