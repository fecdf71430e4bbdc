"""What megatron-core 0.16.1 assumes of CUDA, answered on CPU, and what a rank does before importing megatron.

On a CPU-only torch (gloo), megatron-core trains once these answers are in place, inside the rank's process:

- its RNG tracker (``model_parallel_cuda_manual_seed``, forked by attention even with dropout 0) reads and sets
  ``torch.cuda.get_rng_state`` / ``torch.cuda.manual_seed`` and its own ``_get_cuda_rng_state`` /
  ``_set_cuda_rng_state``: they use the CPU generator instead;
- buffers are allocated with ``device=torch.cuda.current_device()`` (attention, the tensor-parallel mappings
  and layers, p2p): ``current_device`` answers ``"cpu"``;
- the pipeline schedules call ``torch.zeros(..., device="cuda")`` and the tied embedding with PP > 1 calls
  ``weight.data.cuda()``: ``CudaDevicesOnCpu``, a ``TorchFunctionMode``, maps cuda devices to cpu;
- p2p with ``batch_p2p_sync=True`` and ``dist_checkpointing`` call ``torch.cuda.synchronize``: a no-op (the
  model's config also sets ``batch_p2p_sync=False``, ``model.transformer_config``);
- MoE: the all-to-all token dispatcher copies its split sizes to the host on a side stream (``torch.cuda.Stream``,
  ``current_stream``, ``stream``, an event): one CPU stream whose waits and events are no-ops; its
  ``maybe_move_tensor_to_cpu`` turns split sizes into numpy arrays only for CUDA tensors, and gloo's
  ``all_to_all_single`` takes no tensor as split sizes: the answer converts CPU tensors too; the router's
  ``RouterGatingLinearFunction`` reads ``te_general_gemm``, which ``moe_utils`` defines only when Transformer Engine
  imports (a ``NameError`` without it): ``None``, its torch fallback. gloo itself has every collective the
  dispatchers call at EP > 1, TP = 1 (``all_to_all_single`` with unequal splits, ``all_gather_into_tensor``,
  ``reduce_scatter_tensor``).

On CUDA nothing is answered. On Ascend NPUs MindSpeed's adaptor (``mindspeed.megatron_adaptor``) patches megatron
for torch_npu and must be imported before megatron itself (``prepare_megatron``).

A ``TorchFunctionMode`` is per thread: call ``prepare_megatron`` in the thread that runs megatron.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

MEGATRON_CORE_VERSION = "0.16.1"  # the version these answers were measured against
MINDSPEED_INSTALL = "install MindSpeed from its source repository (the Ascend image does; the PyPI name is a placeholder)"


def _cpu(device: Any) -> Any:
    if isinstance(device, str) and device.startswith("cuda"):
        return torch.device("cpu")
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


class CudaDevicesOnCpu(TorchFunctionMode):
    """Maps ``device="cuda..."``, ``Tensor.cuda()`` and ``Tensor.to("cuda")`` to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if "device" in kwargs:
            kwargs = {**kwargs, "device": _cpu(kwargs["device"])}
        if func is torch.Tensor.to:
            args = tuple(_cpu(a) for a in args)
        return func(*args, **kwargs)


# The answers keep the parameters of what they replace (tests/unit/engines/megatron/test_megatron_cpu.py checks).
def _get_rng_state(device: Any = "cuda") -> torch.Tensor:
    return torch.get_rng_state()


def _manual_seed(seed: int) -> None:
    torch.manual_seed(seed)


def _current_device() -> str:
    return "cpu"


def _synchronize(device: Any = None) -> None:
    return None


def _megatron_get_rng_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    return torch.get_rng_state()


def _megatron_set_rng_state(new_state: torch.Tensor, device: int = -1, graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


class _CpuEvent:
    def synchronize(self) -> None:
        return None


class _CpuStream:
    """The CPU's one stream: every instance is it, waits and events are no-ops."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any):
        pass

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _CpuStream)

    def __hash__(self) -> int:
        return 0

    def wait_stream(self, stream: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> _CpuEvent:
        return _CpuEvent()


def _current_stream(device: Any = None) -> _CpuStream:
    return _CpuStream()


def _stream(stream: Any) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


def _move_to_cpu(tensor: torch.Tensor, as_numpy: bool = False, record_stream: bool = False) -> Any:
    if torch.is_tensor(tensor):
        tensor = tensor.cpu()
        return tensor.numpy() if as_numpy else tensor
    return tensor


def cpu_answers() -> list[tuple[Any, str, Callable[..., Any]]]:
    """(owner, attribute, replacement) of every function answered on CPU; imports megatron's RNG module and its
    MoE token dispatcher."""
    import megatron.core.tensor_parallel.random as mrandom
    import megatron.core.transformer.moe.token_dispatcher as dispatcher

    return [
        (torch.cuda, "get_rng_state", _get_rng_state),
        (torch.cuda, "manual_seed", _manual_seed),
        (torch.cuda, "current_device", _current_device),
        (torch.cuda, "synchronize", _synchronize),
        (torch.cuda, "Stream", _CpuStream),
        (torch.cuda, "current_stream", _current_stream),
        (torch.cuda, "stream", _stream),
        (mrandom, "_get_cuda_rng_state", _megatron_get_rng_state),
        (mrandom, "_set_cuda_rng_state", _megatron_set_rng_state),
        (dispatcher, "maybe_move_tensor_to_cpu", _move_to_cpu),
    ]


def absent_names() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, value) of names megatron reads but defines only with Transformer Engine installed."""
    import megatron.core.transformer.moe.moe_utils as moe_utils

    return [(moe_utils, "te_general_gemm", None)]


@contextlib.contextmanager
def cuda_answered_on_cpu() -> Iterator[list[str]]:
    """Within: the answers above and ``CudaDevicesOnCpu``; on exit everything is as it was. Yields what it
    replaced, as ``module.attribute``."""
    saved, added = [], []
    try:
        for owner, name, answer in cpu_answers():
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, answer)
        for owner, name, value in absent_names():
            if not hasattr(owner, name):
                added.append((owner, name))
                setattr(owner, name, value)
        with CudaDevicesOnCpu():
            yield [f"{owner.__name__}.{name}" for owner, name, _ in saved] + [
                f"{owner.__name__}.{name}" for owner, name in added] + ["CudaDevicesOnCpu"]
    finally:
        for owner, name in added:
            delattr(owner, name)
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


_RANK_ANSWERS = contextlib.ExitStack()  # the rank's answers: entered once, kept for the process's lifetime
_APPLIED: list[str] = []


def apply_mindspeed_adaptor() -> list[str]:
    """Import ``mindspeed.megatron_adaptor`` (it patches megatron for torch_npu); only before megatron is imported."""
    if "megatron.core" in sys.modules or "megatron" in sys.modules:
        raise RuntimeError("engine.device=npu: megatron was imported before MindSpeed's adaptor; call "
                           "prepare_megatron('npu') first in the rank's process")
    try:
        importlib.import_module("mindspeed.megatron_adaptor")
    except ModuleNotFoundError as err:
        raise RuntimeError(f"engine.device=npu needs MindSpeed ({err.name} is missing): {MINDSPEED_INSTALL}") from err
    return ["mindspeed.megatron_adaptor"]


def prepare_megatron(device: str) -> list[str]:
    """Ready this rank's process for megatron on ``device`` (cpu, cuda or npu), once; returns what was applied
    (empty on cuda). On cpu the answers stay for the rest of the process (and this thread)."""
    if _APPLIED:
        return list(_APPLIED)
    if device == "cpu":
        _APPLIED.extend(_RANK_ANSWERS.enter_context(cuda_answered_on_cpu()))
    elif device == "npu":
        _APPLIED.extend(apply_mindspeed_adaptor())
    elif device != "cuda":
        raise ValueError(f"engine.device={device!r}: megatron runs on cpu, cuda or npu")
    return list(_APPLIED)
