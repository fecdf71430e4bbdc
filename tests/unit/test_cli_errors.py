"""The one-line rule over ``dockflow train``'s config load and start-up: each bad input below ends in exactly one
stderr line, ``dockflow train: error: ...``, naming the thing and what to do, and exit status 2, before SFT and
the workers; none starts Ray (the cluster's resources are those of a 2-CPU local one).

Covered elsewhere, also one line and exit 2: reward functions that do not import (``rewards/test_functions.py``),
an unreachable MLflow server (``integration/test_mlflow_server.py``), a stage that fails in a worker
(``flow/test_waiting.py``, ``integration/test_reward_functions_run.py``), the Ray head lost mid-run, through a
real ``dockflow train`` process (``integration/test_head_loss.py``)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import ray

from dockflow.cli import main
from dockflow.flow import trainer

CONFIG = "configs/grpo_arith.yaml"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """kind -> (arguments after ``train``, what the line must say)."""
    bad_yaml = write(tmp / "bad.yaml", "run:\n  name: x\n  seed 0\n")
    good = write(tmp / "good.jsonl", '{"prompt": "1+1=", "answer": "2"}\n')
    bad_rows = write(tmp / "bad.jsonl", '{"prompt": "1+1=", "answer": "2"}\nnot json\n')
    no_answer = write(tmp / "no_answer.jsonl", '{"prompt": "1+1="}\n')
    not_a_model = write(tmp / "not_a_model" / "notes.txt", "hi")
    file_data = ["data.source=file", f"data.test_path={good}"]
    port = closed_port()
    return {
        "config file missing": ([str(tmp / "nope.yaml")], f"config file '{tmp / 'nope.yaml'}' not found"),
        "config not YAML": ([bad_yaml], f"config file '{bad_yaml}' is not valid YAML at line 3, column 3"),
        "unknown key": ([CONFIG, "train.iteratons=3"], "did you mean 'train.iterations'?"),
        "bad value": ([CONFIG, "train.lr=abc"], "invalid value for 'train.lr'"),
        "out of range": ([CONFIG, "train.iterations=-1"], "invalid value for 'train.iterations'"),
        "override without =": ([CONFIG, "train.lr"], "override 'train.lr' is not of the form section.key=value"),
        "override not YAML": ([CONFIG, "train.lr=[1"], "override 'train.lr=[1': the value is not valid YAML"),
        "checks across sections": ([CONFIG, "train.dp=3"], "train.dp=3 must divide train.mini_batch_size"),
        "LoRA on megatron": ([CONFIG, "model.lora={rank: 4}", "train.engine=megatron"],
                             "model.lora with train.engine=megatron is not supported yet: set train.engine: fsdp"),
        "LoRA target the model lacks": ([CONFIG, "model.lora={target_modules: [q_proj, qkv]}"],
                                        "model.lora.target_modules: 'qkv' matches no linear layer of the model; its "
                                        "linear layers are down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj"),
        "LoRA rank above a target's size": ([CONFIG, "model.lora={rank: 200, target_modules: [k_proj]}"],
                                            "model.lora.rank=200 exceeds model.layers.0.self_attn.k_proj (128 -> 64): "
                                            "set model.lora.rank <= 64"),
        "data file missing": ([CONFIG, *file_data, f"data.train_path={tmp / 'none.jsonl'}"],
                              f"dataset file '{tmp / 'none.jsonl'}' not found"),
        "malformed row": ([CONFIG, *file_data, f"data.train_path={bad_rows}"], f"{bad_rows}:2: invalid JSON"),
        "row without its column": ([CONFIG, *file_data, f"data.train_path={no_answer}"], f"{no_answer}:1"),
        "model path missing": ([CONFIG, f"model.path={tmp / 'no_model'}", "sft.enabled=false"],
                               f"model.path: model directory '{tmp / 'no_model'}' does not exist"),
        "model path not a model": ([CONFIG, f"model.path={Path(not_a_model).parent}", "sft.enabled=false"],
                                   "is missing config.json"),
        "S3 unreachable": ([CONFIG, "checkpoint.dir=s3://bucket/prefix", f"checkpoint.s3_endpoint=http://127.0.0.1:{port}",
                            "checkpoint.s3_attempts=1"], f"at http://127.0.0.1:{port} failed"),
        "Ray head unreachable": ([CONFIG, f"ray.address=127.0.0.1:{port}", "ray.head_timeout_s=1"],
                                 f"no Ray head answers at ray.address='127.0.0.1:{port}'"),
        "a reward function's column missing": ([CONFIG, *file_data, f"data.train_path={good}", "data.arithmetic.num_val=0",
                                                "reward.functions=[{name: code_tests}]"],
                                               "reward function 'code_tests' requires the column 'tests', which the "
                                               "train rows lack (their columns: answer;"),
        "CPUs the cluster never has": ([CONFIG, "ray.actor_cpus=3"],
                                       "the run's workers ask Ray for 3 CPUs in all ({'actor': 3.0}) but the cluster has 2"),
        "device missing": ([CONFIG, "engine.device=cuda"],
                           "engine.device=cuda needs 1 GPU (actor 1) but the Ray cluster has 0: install a CUDA build of "
                           "torch (and vllm for engine.backend=vllm) on nodes with NVIDIA GPUs, or set engine.device=cpu"),
    }


KINDS = list(cases(Path("/unused")))


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One MLflow store for every case: creating its tables is most of a case's time."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.mark.parametrize("kind", KINDS)
def test_each_bad_input_is_one_line_and_exit_2(kind: str, tracking_uri: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    args, says = cases(tmp_path / "in")[kind]

    real_connect = trainer.connect

    def no_local_cluster(cfg, *args, **kw) -> bool:  # data and models load after connect: reach them without Ray
        return real_connect(cfg, *args, **kw) if cfg.address else False  # an address is probed before ray.init

    monkeypatch.setattr(trainer, "connect", no_local_cluster)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})  # what the local cluster would have
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 2.0}}])
    extra = [f"run.output_dir={tmp_path / 'runs'}", f"sft.cache_dir={tmp_path / 'sft'}",
             f"tracking.uri={tracking_uri}"] if len(args) > 1 else []
    assert main(["train", *args, *extra]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [err.strip()], err
    assert err.startswith("dockflow train: error: ") and says in err, err
    assert not list((tmp_path / "runs").rglob("initial_model"))  # each fails before SFT and the workers
