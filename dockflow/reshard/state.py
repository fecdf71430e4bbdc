"""What the update side hands to resharding: this rank's update shards, their grads, the optimizer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from dockflow.reshard.ledger import MemoryLedger


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (sharing its storage), else the tensor itself. Without grad, ``to_local`` is
    the DTensor's own, long-lived local tensor; with grad it would be a new view each call, which a ledger's weak
    reference would lose at once."""
    to_local = getattr(t, "to_local", None)
    if not callable(to_local):
        return t
    with torch.no_grad():
        return to_local()


@dataclass
class UpdateState:
    """This rank's update-layout weights (name -> local shard), their gradients (default: each weight's
    ``.grad``) and the optimizer whose state is swapped with them. DTensors (FSDP2) are read through their
    local shards, which share storage with them, so swapping those swaps the DTensors too."""

    weights: Mapping[str, torch.Tensor]
    optimizer: torch.optim.Optimizer | None = None
    grads: Mapping[str, torch.Tensor] | None = None

    def local_weights(self) -> dict[str, torch.Tensor]:
        return {n: local_tensor(w) for n, w in self.weights.items()}

    @property
    def device(self) -> torch.device:
        """The device the update weights live on."""
        if not self.weights:
            raise ValueError("UpdateState has no weights")
        devices = {w.device for w in self.local_weights().values()}
        if len(devices) != 1:
            raise ValueError(f"update weights are spread over devices {sorted(map(str, devices))}")
        return devices.pop()

    def grad_tensors(self) -> list[torch.Tensor]:
        grads = self.grads.values() if self.grads is not None else [w.grad for w in self.weights.values()]
        return [local_tensor(g) for g in grads if g is not None]

    def optimizer_tensors(self) -> list[torch.Tensor]:
        if self.optimizer is None:
            return []
        return [local_tensor(v) for state in self.optimizer.state.values() for v in state.values()
                if isinstance(v, torch.Tensor)]

    def by_category(self) -> dict[str, list[torch.Tensor]]:
        """Ledger category -> tensors."""
        return {"update_weights": list(self.local_weights().values()), "grads": self.grad_tensors(),
                "optimizer_state": self.optimizer_tensors()}

    def all_tensors(self) -> list[torch.Tensor]:
        return [t for tensors in self.by_category().values() for t in tensors]

    def track(self, ledger: MemoryLedger) -> None:
        """Track weights, grads and optimizer state in their ledger categories."""
        for category, tensors in self.by_category().items():
            ledger.track(category, tensors)
