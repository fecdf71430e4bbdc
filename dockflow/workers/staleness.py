"""The staleness bound on the update side: how many policy versions old each trained sample is.

A sample's age is the trainer's policy version minus the version that generated it (the dock's
``policy_version`` metadata; -1 marks offline data such as DPO pairs, which has no age). The asynchronous
scheduler keeps every age within ``train.max_staleness`` by construction; this counter checks it on every
mini-batch, masks any sample past the bound out of the loss (dropped, and counted), and reports the
histogram of ages.
"""

from __future__ import annotations

from collections import Counter

import torch
from tensordict import TensorDict


class StalenessCounter:
    """Ages of the samples one update trains on; drops those older than ``bound`` versions."""

    def __init__(self, version: int, bound: int) -> None:
        self.version = version
        self.bound = bound
        self.ages: Counter[int] = Counter()
        self.dropped = 0

    def admit(self, data: TensorDict, versions: torch.Tensor) -> TensorDict:
        """``data`` with the response mask of over-age samples zeroed (so they add nothing to the loss)."""
        online = versions >= 0
        ages = torch.where(online, self.version - versions, torch.zeros_like(versions))
        self.ages.update(ages[online].tolist())
        stale = ages > self.bound
        if bool(stale.any()):
            data = data.clone()
            data["response_mask"][stale] = 0
            self.dropped += int(stale.sum())
        return data

    @classmethod
    def merged(cls, counters: list[StalenessCounter]) -> StalenessCounter:
        """One counter of several ranks' (each counted its own share of the update's samples)."""
        out = cls(counters[0].version, counters[0].bound) if counters else cls(0, 0)
        for counter in counters:
            out.ages.update(counter.ages)
            out.dropped += counter.dropped
        return out

    def metrics(self) -> dict[str, float]:
        """Mean and max age, dropped samples, and how many samples had each age (``staleness/age_<k>``)."""
        total = sum(self.ages.values())
        out = {
            "staleness/mean": sum(a * n for a, n in self.ages.items()) / total if total else 0.0,
            "staleness/max": float(max(self.ages, default=0)),
            "staleness/dropped": float(self.dropped),
        }
        out.update({f"staleness/age_{a}": float(n) for a, n in sorted(self.ages.items())})
        return out
