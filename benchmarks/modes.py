"""How the benchmarks place DockFlow's workers on the 2 devices (CPUs) of Eq. (5) for each schedule.

``sync``: colocated, the actor worker generates and trains with both CPUs. ``async``: disaggregated, one
generator worker with 1 CPU runs up to ``max_staleness`` iterations ahead of the actor with 1 CPU. Both
modes have ND = 2, so their throughputs compare per device.
"""

from __future__ import annotations

from typing import Any


def mode_overrides(mode: str, staleness: int) -> dict[str, Any]:
    """Config overrides (dotted keys) of one schedule."""
    if mode == "sync":
        return {"placement.mode": "colocated", "train.max_staleness": 0, "ray.actor_cpus": 2, "ray.torch_threads": 2}
    if mode == "async":
        return {"placement.mode": "disaggregated", "train.max_staleness": staleness, "ray.actor_cpus": 1,
                "placement.generators": 1, "placement.generator_cpus": 1, "ray.torch_threads": 1}
    raise ValueError(f"mode={mode!r}: choose sync or async")
