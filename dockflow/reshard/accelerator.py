"""The allocator module of a device (``torch.cuda`` / ``torch.npu``), for the ledger and the host swap.

Nothing here imports ``torch_npu``: a tensor is on an NPU only after the engine's worker-device check
(``dockflow.engines.devices.check_worker_device``) imported it and it registered ``torch.npu``, so reshard
needs no import of ``dockflow.engines``.
"""

from __future__ import annotations

from types import ModuleType

import torch


def accelerator_of(device: torch.device) -> ModuleType | None:
    """``torch.cuda`` for CUDA, ``torch.npu`` for an NPU (None while torch_npu is not imported), None on CPU."""
    if device.type == "cuda":
        return torch.cuda
    if device.type == "npu":
        return getattr(torch, "npu", None)
    return None
