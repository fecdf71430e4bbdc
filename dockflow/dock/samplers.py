"""Sample-level helpers on DockBatches: sequence-length-balanced splits across DP ranks (Karmarkar-Karp
with equal counts, or greedy), GRPO group splits, and concatenation. Pure torch, no Ray."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from dockflow.dock.api import DockBatch, DockInvalid
from dockflow.dock.partition import balanced_partitions


def sample_weights(batch: DockBatch, key: str) -> torch.Tensor:
    """Per-sample weight for balancing: a metadata value, a per-sample scalar column, or the count of
    nonzero entries of a multi-dimensional column (e.g. an attention mask)."""
    if key in batch.meta:
        values = batch.meta[key]
    elif key in batch.data.keys():
        column = batch.data[key]
        values = column.reshape(len(batch), -1)
        values = values[:, 0] if values.shape[1] == 1 else (values != 0).sum(dim=1)
    else:
        raise DockInvalid(f"no metadata or column {key!r} to balance on; meta has {list(batch.meta)}")
    return values.to(torch.float64)


def select(batch: DockBatch, positions: Sequence[int]) -> DockBatch:
    """The samples at ``positions`` of ``batch`` (in that order)."""
    pos = torch.as_tensor(list(positions), dtype=torch.long)
    return DockBatch(
        indices=[batch.indices[p] for p in positions],
        data=batch.data[pos] if len(pos) else batch.data[:0],
        meta={k: v[pos] for k, v in batch.meta.items()},
    )


def split_balanced(
    batch: DockBatch,
    dp_size: int,
    key: str = "response_length",
    *,
    group_size: int = 1,
    method: Literal["kk", "greedy"] = "kk",
) -> list[DockBatch]:
    """Split a batch across ``dp_size`` ranks with equal counts and balanced total ``key`` per rank.

    ``group_size > 1`` keeps consecutive groups of that size together on one rank (GRPO groups).
    Every rank's batch keeps ascending indices, so the split is deterministic for a given batch.
    """
    n = len(batch)
    if group_size <= 0 or n % group_size:
        raise DockInvalid(f"batch of {n} samples is not made of whole groups of {group_size}")
    groups = n // group_size
    if groups % dp_size:
        raise DockInvalid(
            f"cannot split {groups} groups of {group_size} evenly across {dp_size} DP ranks"
        )
    weights = sample_weights(batch, key).reshape(groups, group_size).sum(dim=1).tolist()
    parts = balanced_partitions(weights, dp_size, method)
    return [select(batch, [g * group_size + j for g in part for j in range(group_size)]) for part in parts]


def split_groups(batch: DockBatch, group_size: int) -> list[DockBatch]:
    """One DockBatch per GRPO group; the batch must hold whole groups, each contiguous and in order."""
    if len(batch) % group_size:
        raise DockInvalid(f"batch of {len(batch)} samples is not made of whole groups of {group_size}")
    out = []
    for start in range(0, len(batch), group_size):
        group = batch.indices[start : start + group_size]
        first = group[0]
        if first % group_size or group != list(range(first, first + group_size)):
            raise DockInvalid(f"indices {group} are not one whole group of {group_size}")
        out.append(select(batch, range(start, start + group_size)))
    return out


def concat_batches(batches: Sequence[DockBatch]) -> DockBatch:
    """One batch holding all samples of ``batches``, sorted by index."""
    if not batches:
        raise DockInvalid("nothing to concatenate")
    indices = [i for b in batches for i in b.indices]
    order = sorted(range(len(indices)), key=indices.__getitem__)
    data = torch.cat([b.data for b in batches]) if len(batches) > 1 else batches[0].data
    meta = {k: torch.cat([b.meta[k] for b in batches]) for k in batches[0].meta}
    merged = DockBatch(indices=indices, data=data, meta=meta)
    return select(merged, order)
