"""Megatron checkpoints with ``dist_checkpointing``: layout-free, and atomic through DockFlow's checkpoint store.

A checkpoint holds the model's ``sharded_state_dict()`` and the state of a torch optimizer over the rank's local
parameters (``exp_avg`` / ``exp_avg_sq`` of AdamW, any parameter-shaped state, as ShardedTensors sharded like
their parameter; the step count and the groups' hyper-parameters as common state), so a checkpoint saved at one
TP/PP loads into a model and optimizer built at another.

Every rank saves with ``dist_checkpointing.save`` into its OWN temporary directory (no shared file system is
needed), then writes each file it produced as a part of the store's step (``mcore.<file>``: the file's bytes as a
uint8 tensor, streamed, with its size and sha256 recorded); rank 0 adds the index part ``mcore`` (every rank's
files, the layout) and ``commit``s the step, which writes the manifest last (``dockflow.storage.checkpoint_store``), locally
or on S3/MinIO. A save interrupted before the commit leaves no manifest: ``store.latest()`` is still the previous
checkpoint, and retention deletes the leftover parts after the next commit. To load, every rank rebuilds the
directory from the checked parts in a temporary directory and calls ``dist_checkpointing.load``.

The save strategy (``sync_save_strategy``) is megatron's torch_dist format written synchronously by
``torch.distributed.checkpoint`` in the calling thread (``FileSystemWriter``, one thread). megatron's own
torch_dist save strategy is async-first even when used synchronously: it creates its results queue with a
``spawn``-mode ``multiprocessing.Manager`` (a fresh interpreter per rank that re-imports ``__main__``, so the
launching script needs a ``__main__`` guard; in a forked gloo rank of a tiny TP=2 model its first save took 9.7 s,
later ones 0.18 s), forks one writer process per file bucket, and calls ``torch.cuda.synchronize`` after its
non-blocking copies to host. The synchronous writer does none of these (0.05 s there) and writes the same format,
which megatron's torch_dist load strategy reads.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dockflow.storage.checkpoint_store import CheckpointStore
from dockflow.storage.manifest import CheckpointError

INDEX_PART = "mcore"  # the part that lists every rank's files; file parts are "mcore.<file name>"
_FILE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,120}$")


def file_part(filename: str, index: str = INDEX_PART) -> str:
    """The store part holding a dist_checkpointing file (``.metadata`` -> ``mcore..metadata``), named after its
    checkpoint's index part ``index``."""
    if not _FILE_RE.match(filename):
        raise CheckpointError(
            f"dist_checkpointing wrote a file named {filename!r} that no store part can name"
        )
    return f"{index}.{filename}"


def sync_save_strategy() -> Any:
    """A torch_dist save strategy that writes synchronously in the calling thread (module docstring: why)."""
    from megatron.core.dist_checkpointing.strategies.torch import (
        MCoreSavePlanner,
        TorchDistSaveShardedStrategy,
        _replace_state_dict_keys_with_sharded_keys,
        mcore_to_pyt_state_dict,
    )
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint import save as dcp_save

    class SyncTorchDistSave(TorchDistSaveShardedStrategy):
        def save(self, sharded_state_dict: Any, checkpoint_dir: Any) -> None:
            state, _, _ = _replace_state_dict_keys_with_sharded_keys(
                sharded_state_dict, self.keep_only_main_replica
            )
            planner = MCoreSavePlanner(
                dedup_replicated_tensors=not self.keep_only_main_replica, flatten_state_dict=False
            )
            writer = FileSystemWriter(checkpoint_dir, thread_count=1, sync_files=True)
            dcp_save(mcore_to_pyt_state_dict(state, False), storage_writer=writer, planner=planner)

    return SyncTorchDistSave("torch_dist", 1)


def _params(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _param_shards(model_state: Any, optimizer: torch.optim.Optimizer) -> dict[int, Any]:
    """For each optimizer parameter's index, its ShardedTensor in the model's sharded state dict."""
    from megatron.core.dist_checkpointing.optimizer import get_param_id_to_sharded_param_map

    shards = get_param_id_to_sharded_param_map(model_state, _params(optimizer))
    missing = [i for i in range(len(_params(optimizer))) if i not in shards]
    if missing:
        raise CheckpointError(
            f"megatron checkpoint: optimizer parameters {missing[:3]} are not parameters of the "
            "model; build the optimizer over model.parameters()"
        )
    return shards


def optimizer_state(optimizer: torch.optim.Optimizer, shards: dict[int, Any]) -> dict[str, Any]:
    """The optimizer's state for ``dist_checkpointing``: each parameter-shaped state tensor as a ShardedTensor
    (``optimizer.<key>.<parameter key>``), the step and the groups' hyper-parameters as common state."""
    from megatron.core.dist_checkpointing.optimizer import make_sharded_optimizer_tensor

    params = _params(optimizer)
    states = [optimizer.state.get(p, {}) for p in params]
    steps = {float(s["step"]) for s in states if "step" in s}
    if len(steps) > 1 or (steps and any("step" not in s for s in states)):
        raise CheckpointError(
            f"megatron checkpoint: the optimizer's parameters are at different steps {sorted(steps)}; "
            "save after a step of every parameter"
        )
    keys = sorted({k for s in states for k, v in s.items() if k != "step" and isinstance(v, torch.Tensor)})
    sharded = {
        key: {
            i: make_sharded_optimizer_tensor(shards[i], s[key], f"optimizer.{key}")
            for i, s in enumerate(states)
            if key in s
        }
        for key in keys
    }
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return {
        "state": sharded,
        "state_keys": keys,
        "step": steps.pop() if steps else None,
        "param_groups": groups,
    }


def _all_ok(error: str | None, what: str) -> None:
    """Raise on every rank if any rank failed ``what`` (so no rank waits on the others' next collective)."""
    errors: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if failed:
        rank, err = failed[0]
        raise CheckpointError(f"megatron checkpoint {what} failed on rank {rank}: {err}")


def _write_file_parts(store: CheckpointStore, step: int, local: Path, index: str) -> list[str]:
    """Write every file under ``local`` (this rank's dist_checkpointing output) as a part of ``step``."""
    names = []
    for path in sorted(local.iterdir()):
        data = (
            torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)
            if path.stat().st_size
            else torch.empty(0, dtype=torch.uint8)
        )
        store.write_part(step, file_part(path.name, index), data)
        names.append(path.name)
    return names


def write_checkpoint(
    store: CheckpointStore, step: int, model: Any, optimizer: torch.optim.Optimizer, index: str = INDEX_PART
) -> list[str]:
    """Write ``model`` and ``optimizer`` as parts of ``step`` of ``store`` without committing it; every rank
    calls it. Returns, on every rank, the parts written (the index part ``index`` and its file parts): whoever
    commits the step lists them, or commits whatever was written (as the run's driver does)."""
    from megatron.core import dist_checkpointing, parallel_state

    model_state = model.sharded_state_dict()
    state = {
        "model": model_state,
        "optimizer": optimizer_state(optimizer, _param_shards(model_state, optimizer)),
    }
    local = Path(tempfile.mkdtemp(prefix=f"mcore-save-{step}-"))
    try:
        error, names = None, []
        try:
            dist_checkpointing.save(state, str(local), sharded_strategy=sync_save_strategy())
            names = _write_file_parts(store, step, local, index)
        except Exception as exc:  # reported to every rank, so none waits for the others
            error = f"{type(exc).__name__}: {exc}"
        _all_ok(error, f"save of step {step} at {store.location(step)}")
        files: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(files, names)
        every = sorted({n for rank_files in files for n in rank_files})
        error = None
        if dist.get_rank() == 0:
            layout = {
                "tp": parallel_state.get_tensor_model_parallel_world_size(),
                "pp": parallel_state.get_pipeline_model_parallel_world_size(),
                "world": dist.get_world_size(),
            }
            try:
                store.write_part(step, index, {"files": every, "layout": layout})
            except Exception as exc:  # reported to every rank, so none waits for the others
                error = f"{type(exc).__name__}: {exc}"
        _all_ok(error, f"index of step {step} at {store.location(step)}")
    finally:
        shutil.rmtree(local, ignore_errors=True)
    return [index, *(file_part(n, index) for n in every)]


def save_checkpoint(
    store: CheckpointStore,
    step: int,
    model: Any,
    optimizer: torch.optim.Optimizer,
    meta: dict[str, Any],
    extra_parts: tuple[str, ...] = (),
) -> None:
    """Save ``model`` and ``optimizer`` as checkpoint ``step`` of ``store`` (``write_checkpoint``); every rank
    calls it. Rank 0 commits with ``meta`` (and ``extra_parts``, written by the caller before); until then the
    step does not exist."""
    parts = write_checkpoint(store, step, model, optimizer)
    error = None
    if dist.get_rank() == 0:
        try:
            store.commit(step, meta, parts=[*parts, *extra_parts])
        except Exception as exc:  # reported to every rank, so none waits for the others
            error = f"{type(exc).__name__}: {exc}"
    _all_ok(error, f"commit of step {step} at {store.location(step)}")


def _fresh_state(optimizer: torch.optim.Optimizer, keys: list[str]) -> None:
    """Give every parameter zero state under ``keys`` (the templates ``dist_checkpointing.load`` fills)."""
    for p in _params(optimizer):
        optimizer.state[p] = {key: torch.zeros_like(p, memory_format=torch.preserve_format) for key in keys}


def _restore(optimizer: torch.optim.Optimizer, loaded: dict[str, Any]) -> None:
    groups = loaded["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        raise CheckpointError(
            f"megatron checkpoint: it holds {len(groups)} optimizer parameter groups, the optimizer "
            f"has {len(optimizer.param_groups)}; build the optimizer as it was saved"
        )
    for group, saved in zip(optimizer.param_groups, groups, strict=True):
        group.update(saved)
    for i, p in enumerate(_params(optimizer)):
        state = {key: loaded["state"][key][i] for key in loaded["state_keys"]}
        if loaded["step"] is not None:
            state["step"] = torch.tensor(loaded["step"], dtype=torch.float32)
        optimizer.state[p] = state


def load_checkpoint(
    store: CheckpointStore,
    step: int,
    model: Any,
    optimizer: torch.optim.Optimizer | None,
    index_part: str = INDEX_PART,
) -> dict:
    """Load checkpoint ``step`` of ``store`` (the one indexed by ``index_part``) into ``model`` (and ``optimizer``),
    built at any TP/PP; every rank calls it. Returns the index's layout (the one it was saved at)."""
    from megatron.core import dist_checkpointing

    index = store.read_part(step, index_part)
    local = Path(tempfile.mkdtemp(prefix=f"mcore-load-{step}-"))
    try:
        for name in index["files"]:
            (local / name).write_bytes(store.read_part(step, file_part(name, index_part)).numpy().tobytes())
        model_state = model.sharded_state_dict()
        state: dict[str, Any] = {"model": model_state}
        if optimizer is not None:
            keys = dist_checkpointing.load_common_state_dict(str(local))["optimizer"]["state_keys"]
            _fresh_state(optimizer, keys)
            state["optimizer"] = optimizer_state(optimizer, _param_shards(model_state, optimizer))
        loaded = dist_checkpointing.load(state, str(local))
    finally:
        shutil.rmtree(local, ignore_errors=True)
    model.load_state_dict(loaded["model"])
    if optimizer is not None:
        _restore(optimizer, loaded["optimizer"])
    return index["layout"]
