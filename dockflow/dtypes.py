"""Model dtypes by config name, for every room that loads a model (``models``, ``rewards``); imports no room."""

from __future__ import annotations

import torch

MODEL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype of a config name (``float32``, ``bfloat16``, ``float16``); a torch dtype as it is."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return MODEL_DTYPES[dtype]
    except KeyError:
        raise ValueError(f"model dtype '{dtype}' is not supported: use float32, bfloat16 or float16") from None
