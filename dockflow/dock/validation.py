"""Client-side checks of puts, gets and resets, done before anything is sent (both backends use them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import torch
from tensordict import TensorDictBase

from dockflow.dock.api import META_KEYS, DockInvalid, DockSpec
from dockflow.dock.request import DockRequest
from dockflow.dock.window import Window


def check_indices(spec: DockSpec, indices: Sequence[int] | np.ndarray | torch.Tensor, what: str) -> np.ndarray:
    """Indices as int64, each in ``[0, capacity)`` and none twice."""
    if isinstance(indices, torch.Tensor):
        indices = indices.cpu().numpy()
    array = np.asarray(indices)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise DockInvalid(f"{what}: indices must be a flat sequence of integers, got {array.dtype} {array.shape}")
    array = array.astype(np.int64, copy=False)
    bad = array[(array < 0) | (array >= spec.capacity)]
    if len(bad):
        raise DockInvalid(f"{what}: indices {bad[:8].tolist()} out of range [0, {spec.capacity})")
    if len(np.unique(array)) != len(array):
        values, counts = np.unique(array, return_counts=True)
        raise DockInvalid(f"{what}: indices repeated: {values[counts > 1][:8].tolist()}")
    return array


def check_put(
    spec: DockSpec,
    indices: Sequence[int],
    data: TensorDictBase | Mapping[str, torch.Tensor],
    meta: Mapping[str, Sequence[int] | torch.Tensor] | None,
) -> tuple[np.ndarray, dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """Validated (indices, column tensors, metadata arrays) of a put."""
    index = check_indices(spec, indices, "put")
    n = len(index)
    if isinstance(data, TensorDictBase):
        if not data.batch_size or data.batch_size[0] != n:
            raise DockInvalid(f"put: data.batch_size is {list(data.batch_size)} for {n} indices")
    tensors: dict[str, torch.Tensor] = {}
    for column, tensor in data.items():
        if column not in spec.columns:
            raise DockInvalid(f"put: unknown column {column!r}; the dock has {list(spec.columns)}")
        if not isinstance(tensor, torch.Tensor):
            raise DockInvalid(f"put: column {column!r} is a {type(tensor).__name__}, not a tensor")
        if tensor.dtype != spec.columns[column]:
            raise DockInvalid(f"put: column {column!r} has dtype {tensor.dtype}, the dock holds {spec.columns[column]}")
        if tensor.dim() == 0 or tensor.shape[0] != n:
            raise DockInvalid(f"put: column {column!r} has shape {list(tensor.shape)} for {n} indices")
        tensors[column] = tensor
    if not tensors and not meta:
        raise DockInvalid("put: no columns and no metadata")
    return index, tensors, check_meta(meta, n)


def check_meta(meta: Mapping[str, Sequence[int] | torch.Tensor] | None, n: int) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for key, values in (meta or {}).items():
        if key not in META_KEYS:
            raise DockInvalid(f"put: unknown metadata {key!r}; allowed: {list(META_KEYS)}")
        array = values.cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
        if array.shape != (n,):
            raise DockInvalid(f"put: metadata {key!r} has shape {list(array.shape)} for {n} indices")
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise DockInvalid(f"put: metadata {key!r} must be integers, got {array.dtype}")
        out[key] = array.astype(np.int64)
    return out


def check_window(spec: DockSpec, window: Sequence[int] | None, what: str) -> Window | None:
    """``(lo, hi)`` with ``0 <= lo < hi <= capacity``, both on group boundaries, or None (the whole dock)."""
    if window is None:
        return None
    if len(window) != 2:
        raise DockInvalid(f"{what}: window must be (lo, hi), not {window!r}")
    lo, hi = (int(x) for x in window)
    if not 0 <= lo < hi <= spec.capacity or lo % spec.group_size or hi % spec.group_size:
        raise DockInvalid(
            f"{what}: window ({lo}, {hi}) must satisfy 0 <= lo < hi <= capacity ({spec.capacity}) with both "
            f"multiples of group_size ({spec.group_size})"
        )
    return lo, hi


def check_reset(spec: DockSpec, keep: Sequence[int], window: Sequence[int] | None) -> tuple[np.ndarray, Window | None]:
    """Kept indices (inside the window, if one is given) and the window."""
    kept = check_indices(spec, keep, "reset")
    win = check_window(spec, window, "reset")
    if win is not None and len(kept) and (kept.min() < win[0] or kept.max() >= win[1]):
        raise DockInvalid(f"reset: kept indices must lie in the window {list(win)}")
    return kept, win


def check_get(spec: DockSpec, request: DockRequest) -> None:
    """What can be refused without asking the controller (``request.columns`` filled in)."""
    consumer, batch_size, columns = request.consumer, request.batch_size, request.columns or ()
    if request.dp_share is not None:
        if len(request.dp_share) != 2 or not 0 <= request.dp_share[0] < request.dp_share[1]:
            raise DockInvalid(f"get by {consumer!r}: dp_share must be (rank, ranks) with 0 <= rank < ranks, not "
                              f"{request.dp_share!r}")
        check_get(spec, replace(request, batch_size=batch_size * request.dp_share[1], dp_share=None))
    unknown = [c for c in columns if c not in spec.columns]
    if unknown:
        raise DockInvalid(f"get by {consumer!r}: unknown columns {unknown}; the dock has {list(spec.columns)}")
    if not columns:
        raise DockInvalid(f"get by {consumer!r}: no columns requested")
    if batch_size <= 0 or batch_size > spec.capacity:
        raise DockInvalid(f"get by {consumer!r}: batch_size {batch_size} not in [1, capacity={spec.capacity}]")
    if request.whole_groups and batch_size % spec.group_size:
        raise DockInvalid(
            f"get by {consumer!r}: whole_groups needs batch_size ({batch_size}) to be a multiple of "
            f"group_size ({spec.group_size})"
        )


def check_columns(spec: DockSpec, consumer: str, columns: Sequence[str]) -> tuple[str, ...]:
    if isinstance(columns, str):
        raise DockInvalid(f"consumer {consumer!r}: columns must be a list of names, not the string {columns!r}")
    unknown = [c for c in columns if c not in spec.columns]
    if unknown or not columns:
        raise DockInvalid(f"consumer {consumer!r}: columns {list(columns)} must be a non-empty subset of {list(spec.columns)}")
    return tuple(columns)
