"""The peak memory a model worker reached since its last reading: host RSS on CPU, the allocator's peak on a device.

Linux keeps a process's peak resident set (``VmHWM`` in ``/proc/self/status``) and resets it to the current one when
``5`` is written to ``/proc/self/clear_refs``; so each reading is the peak of the iteration since the previous
reading, not since the process started. On CUDA / NPU the allocator's ``max_memory_allocated`` is read and reset.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dockflow.engines.devices import accelerator_module

STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def host_peak_mb() -> float | None:
    """This process's peak resident memory in MiB since the last call (None off Linux)."""
    try:
        fields = dict(line.split(":", 1) for line in STATUS.read_text().splitlines() if ":" in line)
        peak = int(fields["VmHWM"].split()[0]) / 1024
        CLEAR_REFS.write_text("5")  # the next reading starts from the current resident set
    except (OSError, KeyError, ValueError):
        return None
    return peak


def peak_memory_metrics(role: str, device: torch.device) -> dict[str, float]:
    """``memory/<role>_peak_rss_mb`` (and ``memory/<role>_peak_device_mb`` on an accelerator) since the last call."""
    out = {}
    host = host_peak_mb()
    if host is not None:
        out[f"memory/{role}_peak_rss_mb"] = host
    module = accelerator_module(device.type)
    if module is not None and module.is_available():
        out[f"memory/{role}_peak_device_mb"] = module.max_memory_allocated(device) / 2**20
        module.reset_peak_memory_stats(device)
    return out
