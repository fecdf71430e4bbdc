"""Shard geometry: which boxes of a full tensor a shard holds, and where they sit in the shard.

A shard is described by a ``BlockMap``: the local tensor's shape and a list of ``Block`` s, each a box of the
full tensor copied by pure translation to a box of the local tensor. Every partition the package knows
(TP column/row splits, fused QKV / gate-up sections, expert slices, FSDP dim-0 chunks with padding) is a
composition of three operations on a map: ``narrow`` (take a range of the local tensor along one dim),
``concat`` (stack maps along one dim) and ``pad`` (grow the local tensor with unused room). Resharding
then only needs box intersections between an update shard's blocks and a generation shard's blocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import prod

import torch


@dataclass(frozen=True)
class Block:
    """``extent`` elements of the full tensor from ``full_start``, stored from ``local_start`` in the shard."""

    full_start: tuple[int, ...]
    local_start: tuple[int, ...]
    extent: tuple[int, ...]

    def full_slices(self) -> tuple[slice, ...]:
        return tuple(slice(s, s + e) for s, e in zip(self.full_start, self.extent, strict=True))

    def local_slices(self) -> tuple[slice, ...]:
        return tuple(slice(s, s + e) for s, e in zip(self.local_start, self.extent, strict=True))

    @property
    def numel(self) -> int:
        return prod(self.extent)


@dataclass(frozen=True)
class BlockMap:
    """The local tensor of one shard: its shape and the blocks of the full tensor it holds."""

    local_shape: tuple[int, ...]
    blocks: tuple[Block, ...]

    @classmethod
    def full(cls, shape: Sequence[int]) -> BlockMap:
        """The whole tensor, unsharded."""
        shape = tuple(shape)
        zeros = (0,) * len(shape)
        return cls(shape, (Block(zeros, zeros, shape),) if prod(shape) else ())

    @property
    def numel(self) -> int:
        return prod(self.local_shape)

    @property
    def padded(self) -> bool:
        """True when some of the local tensor holds no data (FSDP padding)."""
        return sum(b.numel for b in self.blocks) != self.numel

    def narrow(self, dim: int, start: int, length: int) -> BlockMap:
        """The map of ``local[start:start+length]`` along ``dim``."""
        if start < 0 or length < 0 or start + length > self.local_shape[dim]:
            raise ValueError(f"narrow({dim}, {start}, {length}) is outside local shape {self.local_shape}")
        blocks = []
        for b in self.blocks:
            lo = max(b.local_start[dim], start)
            hi = min(b.local_start[dim] + b.extent[dim], start + length)
            if hi <= lo:
                continue
            shift = lo - b.local_start[dim]
            blocks.append(Block(_put(b.full_start, dim, b.full_start[dim] + shift),
                                _put(b.local_start, dim, lo - start), _put(b.extent, dim, hi - lo)))
        return BlockMap(_put(self.local_shape, dim, length), tuple(blocks))

    def pad(self, dim: int, size: int) -> BlockMap:
        """The same blocks in a local tensor grown to ``size`` along ``dim``."""
        if size < self.local_shape[dim]:
            raise ValueError(f"pad to {size} is smaller than local size {self.local_shape[dim]} of dim {dim}")
        return BlockMap(_put(self.local_shape, dim, size), self.blocks)


def concat(maps: Sequence[BlockMap], dim: int) -> BlockMap:
    """The map of ``torch.cat`` of the maps' local tensors along ``dim``."""
    if not maps:
        raise ValueError("concat needs at least one map")
    blocks: list[Block] = []
    offset = 0
    for m in maps:
        for b in m.blocks:
            blocks.append(Block(b.full_start, _put(b.local_start, dim, b.local_start[dim] + offset), b.extent))
        offset += m.local_shape[dim]
    return BlockMap(_put(maps[0].local_shape, dim, offset), tuple(blocks))


def intersect(a: Block, b: Block) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
    """Where the full-tensor boxes of ``a`` and ``b`` overlap: (slices into a's local, slices into b's local)."""
    a_slices, b_slices = [], []
    for fa, la, ea, fb, lb, eb in zip(a.full_start, a.local_start, a.extent,
                                      b.full_start, b.local_start, b.extent, strict=True):
        lo, hi = max(fa, fb), min(fa + ea, fb + eb)
        if hi <= lo:
            return None
        a_slices.append(slice(la + lo - fa, la + hi - fa))
        b_slices.append(slice(lb + lo - fb, lb + hi - fb))
    return tuple(a_slices), tuple(b_slices)


def copy_overlap(dst: torch.Tensor, dst_map: BlockMap, src: torch.Tensor, src_map: BlockMap) -> int:
    """Copy every element ``src`` holds that ``dst`` needs; returns the number of elements copied."""
    copied = 0
    for db in dst_map.blocks:
        for sb in src_map.blocks:
            hit = intersect(db, sb)
            if hit is not None:
                dst[hit[0]].copy_(src[hit[1]])
                copied += dst[hit[0]].numel()
    return copied


def extract(full: torch.Tensor, smap: BlockMap) -> torch.Tensor:
    """The local tensor of ``smap`` cut from ``full`` (padding zero-filled), contiguous."""
    make = torch.zeros if smap.padded else torch.empty
    out = make(smap.local_shape, dtype=full.dtype, device=full.device)
    for b in smap.blocks:
        out[b.local_slices()].copy_(full[b.full_slices()])
    return out


def assemble(shape: Sequence[int], pieces: Iterable[tuple[BlockMap, torch.Tensor]]) -> torch.Tensor:
    """The full tensor put together from shards; ValueError when the shards leave part of it uncovered."""
    pieces = list(pieces)
    if not pieces:
        raise ValueError("assemble needs at least one shard")
    first = pieces[0][1]
    out = torch.zeros(tuple(shape), dtype=first.dtype, device=first.device)
    covered = torch.zeros(tuple(shape), dtype=torch.bool)
    for smap, local in pieces:
        if tuple(local.shape) != smap.local_shape:
            raise ValueError(f"shard of shape {tuple(local.shape)} does not match its map {smap.local_shape}")
        for b in smap.blocks:
            out[b.full_slices()] = local[b.local_slices()]
            covered[b.full_slices()] = True
    if not bool(covered.all()):
        raise ValueError(f"the shards cover {int(covered.sum())} of {covered.numel()} elements of shape {tuple(shape)}")
    return out


def _put(values: tuple[int, ...], dim: int, value: int) -> tuple[int, ...]:
    return values[:dim] + (value,) + values[dim + 1:]
