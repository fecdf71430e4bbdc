"""Tensors on the wire and in warehouses as numpy arrays: Ray moves numpy arrays through its shared-memory
object store zero-copy (it pickles torch tensors in-band, with an extra copy, unless a global flag is set),
and warehouses and controllers then never import torch. Dtypes numpy lacks (bfloat16, float8) travel as
same-width integers and are viewed back bit-exactly."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np
import torch

_VIEW_AS = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
}


def wire_dtype(dtype: torch.dtype) -> str:
    """The numpy dtype (as a string) a column of ``dtype`` is stored and moved as."""
    return str(torch.empty(0, dtype=_VIEW_AS.get(dtype, dtype)).numpy().dtype)


def wire_dtypes(columns: Mapping[str, torch.dtype]) -> dict[str, str]:
    return {c: wire_dtype(d) for c, d in columns.items()}


def to_wire(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (made contiguous), bit-identical."""
    tensor = tensor.detach().cpu().contiguous()
    view = _VIEW_AS.get(tensor.dtype)
    return (tensor.view(view) if view is not None else tensor).numpy()


def from_wire(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The tensor behind ``array``, sharing its memory (possibly read-only object-store memory).

    Callers only read it and copy out of it (into an assembled batch), never write to it.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "non-writable array": we never write to it
        tensor = torch.from_numpy(array)
    return tensor.view(dtype) if dtype in _VIEW_AS else tensor


def tensors_to_wire(tensors: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: to_wire(v) for k, v in tensors.items()}


def nbytes(arrays: Mapping[str, np.ndarray]) -> int:
    return sum(a.nbytes for a in arrays.values())
