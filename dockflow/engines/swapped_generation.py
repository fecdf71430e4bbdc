"""What the resharding training engines share once allgather-swap has moved their weights into a generation
copy (FSDP over DP ranks, megatron over TP x PP ranks): the update state brought back for a block, the
generation weights, and the memory ledger's metrics.

An engine using it sets ``self._reshard`` (the last ``ReshardResult``, None before the first), ``self.ledger``
(a ``MemoryLedger``), ``self.rank``, ``self.device`` and ``self.generation_model``, and implements
``_to_generation()`` (the reshard) and ``_update_state()`` (the tensors swapped to host during generation).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from dockflow.reshard import HostSwap, MemoryLedger, PinnedArena


class SwappedGeneration:
    """Mixin of the resharding training engines (``FSDPTrainingEngine``, ``MegatronTrainingEngine``)."""

    _arena: PinnedArena | None = None  # made on first use by ``_host_arena``

    @contextmanager
    def _update_on_device(self) -> Iterator[None]:
        """The update state on the device for the block; afterwards the engine is in the state it was in (the
        generation weights stay valid: the update weights do not change in between)."""
        result = self._reshard
        if result is None or result.swap is None:
            yield
            return
        result.swap.swap_back()
        try:
            yield
        finally:
            result.swap = HostSwap.swap_out(self._update_state().all_tensors(), self.device, arena=self._host_arena())

    def _host_arena(self) -> PinnedArena | None:
        """The pinned host bytes every swap-out of this engine reuses (on an accelerator; None on CPU, where the
        host copy is new memory each time and the freed storages really shrink the process)."""
        if self.device.type == "cpu":
            return None
        if self._arena is None:
            self._arena = PinnedArena(self.device)
        return self._arena

    def generation_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The reshard (collective on every rank): full (HF-named) weights of ``generation_model``."""
        self._to_generation()
        for name, param in self.generation_model.named_parameters():
            yield name, param.detach()

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.generation_weights()

    def memory_metrics(self) -> dict[str, float]:
        """The ledger since the last call as ``memory/rank<r>/<phase>/<category>_bytes``; starts a new one."""
        metrics = {f"memory/rank{self.rank}/{k.removeprefix('memory/')}": v for k, v in self.ledger.to_metrics().items()}
        self.ledger = MemoryLedger(self.device, self.rank)  # the next reshard tracks what it moves
        return metrics
