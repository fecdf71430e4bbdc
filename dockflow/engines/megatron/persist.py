"""What :class:`~dockflow.engines.megatron.training.MegatronTrainingEngine` writes and reads: the HF directory
(``save_pretrained``), the run's checkpoints (``save_state`` / ``load_state``: each rank's shards through
``dist_checkpointing`` into the checkpoint store, ``checkpoint.py``) and the in-memory layout-free state
(``state_dict`` / ``load_state_dict``: full HF-named tensors gathered on every rank).

A mixin over the engine's model, optimizer, spec and update <-> generation cycle, kept apart so the engine's
training code stays readable. Every method is collective over the engine's ranks.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dockflow.engines.megatron import model as mg
from dockflow.engines.megatron.checkpoint import INDEX_PART, load_checkpoint, write_checkpoint
from dockflow.engines.megatron.convert import DecoderSpec, hf_to_megatron, megatron_to_hf
from dockflow.storage.manifest import CheckpointError

ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")
DIST_CHECKPOINT = "dist_checkpoint"  # the key of the worker's part that names the checkpoint's index part


class MegatronPersistence:
    """Saving and loading for the megatron engine (the attributes below are the engine's)."""

    model: Any
    optimizer: torch.optim.Optimizer
    spec: DecoderSpec
    rank: int
    generation_model: nn.Module
    _to_generation: Callable[[], None]
    _to_update: Callable[[], None]
    _update_on_device: Callable[[], AbstractContextManager[None]]

    def _gather_hf(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return megatron_to_hf(mg.gather_full(local, self.spec), self.spec)

    def _local_from_hf(self, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return mg.local_shard(hf_to_megatron(hf, self.spec), self.spec)

    def save_state(self, store: Any, step: int, part: str) -> dict[str, Any]:
        """Each rank's shards and AdamW state into checkpoint ``step`` through ``dist_checkpointing`` (parts
        ``<part>.mcore*``, committed by the driver), loadable at any TP / PP; returns the index part's name."""
        index = f"{part}.{INDEX_PART}"
        with self._update_on_device():
            write_checkpoint(store, step, self.model, self.optimizer, index)
        return {DIST_CHECKPOINT: index}

    def load_state(self, store: Any, step: int, part: str, saved: Any) -> None:
        """Load the checkpoint :meth:`save_state` wrote (saved at any TP / PP) into this rank's shards and AdamW
        state, then reshard for generation."""
        if not isinstance(saved, dict) or DIST_CHECKPOINT not in saved:
            raise CheckpointError(f"checkpoint {store.location(step)} part {part!r} holds no dist_checkpointing "
                                  "checkpoint (saved by another train.engine, or a megatron critic saved before its "
                                  "checkpoints went through dist_checkpointing); resume it with the engine and "
                                  "DockFlow version that saved it")
        self._to_update()
        load_checkpoint(store, step, self.model, self.optimizer, saved[DIST_CHECKPOINT])
        self._to_generation()

    def save_pretrained(self, path: str | Path) -> Path:
        """The current policy as a Hugging Face directory (collective; rank 0 writes it, atomically: a temporary
        sibling renamed into place). The tokenizer is the caller's."""
        self._to_generation()
        path = Path(path)
        if self.rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
            try:
                self.generation_model.save_pretrained(tmp)
                if path.exists():
                    shutil.rmtree(path)
                os.replace(tmp, path)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        dist.barrier()
        return path

    def state_dict(self) -> dict[str, Any]:
        """Layout-free: the full HF-named weights, and AdamW's step, hyper-parameters and full moments (HF names),
        on every rank (collective); the engine stays in the state it was in."""
        with self._update_on_device():
            return self._full_state()

    def _full_state(self) -> dict[str, Any]:
        params = dict(self.model.named_parameters())
        state = self.optimizer.state
        optimizer: dict[str, Any] = {"param_groups": [{k: v for k, v in g.items() if k != "params"}
                                                      for g in self.optimizer.param_groups]}
        if all(p in state for p in params.values()):
            optimizer["step"] = float(state[params[next(iter(params))]]["step"])
            for key in ADAM_MOMENTS:
                optimizer[key] = self._gather_hf({n: state[p][key] for n, p in params.items()})
        return {"model": self._gather_hf({n: p.detach() for n, p in params.items()}), "optimizer": optimizer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Each rank keeps its shard of :meth:`state_dict` output, saved at any TP / PP; then the generation copy
        takes the loaded weights by a reshard (collective)."""
        self._to_update()
        params = dict(self.model.named_parameters())
        weights = self._local_from_hf(state["model"])
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(weights[name])
        saved = state["optimizer"]
        for group, hyper in zip(self.optimizer.param_groups, saved["param_groups"], strict=True):
            group.update(hyper)
        self.optimizer.state.clear()
        if "step" in saved:
            moments = {key: self._local_from_hf(saved[key]) for key in ADAM_MOMENTS}
            for name, param in params.items():
                self.optimizer.state[param] = {"step": torch.tensor(saved["step"]),
                                               **{key: moments[key][name].to(param.device, copy=True)
                                                  for key in ADAM_MOMENTS}}
        self._to_generation()
