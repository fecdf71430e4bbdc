"""Padding-free packing: a batch's rows as one row, each sequence with its own position ids.

Rollouts are stored padded (prompts on the left, responses on the right). Packed, only the real tokens of every row go
through the model, concatenated into one row of N tokens; position ids restart at 0 for each sequence, and with no
attention mask Transformers builds the attention from them (``masking_utils.find_packed_sequence_indices``): causal
inside each sequence, nothing across. On CUDA with ``attn_implementation="flash_attention_2"`` the same position ids
select flash-attention's varlen kernel (``modeling_flash_attention_utils.prepare_fa_kwargs_from_position_ids``), which
computes only the blocks inside each sequence; sdpa and eager on CPU build a block-diagonal [N, N] mask and compute
every block of it.

    hidden = packed_outputs(model, ids, mask, keep_r, run=last_hidden)  # [B, keep_r, H], as response_outputs

verl's ``use_remove_padding``, NeMo-RL's ``sequence_packing`` and OpenRLHF's ``packing_samples`` are this. Where it
pays against the shared-prompt pass is :func:`packing_pays` (docs/engines.md has the measurements).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

if TYPE_CHECKING:
    from dockflow.engines.routing import Routing

PAIRS_PER_POSITION_PER_HIDDEN = 3
"""One position's share of a decoder layer's linear work costs about as much as ``3 x hidden_size`` attended pairs
of the attention. Measured on this CPU (sdpa, one thread) with the demo's model (hidden 128, intermediate 512): a
packed pass over N tokens took 31 us per position plus 71 ns per pair of its N x N masked attention, 439 pairs per
position, 3.4 x hidden. Counting multiply-adds (q, k, v, o and the MLP against QK^T and AV) gives about 7 x hidden;
the lower, measured rate errs towards not packing."""


def packed_rows(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index into the flattened [B, T] batch of every real token, in row order; each one's position id in its
    sequence)."""
    flat = mask.reshape(-1).bool()
    index = flat.nonzero().squeeze(-1)
    positions = (mask.long().cumsum(-1) - 1).reshape(-1)[index]
    return index, positions


def packed_outputs(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, keep_r: int,
                   run: Callable[..., torch.Tensor], *, routing: Routing | None = None) -> torch.Tensor:
    """``run``'s outputs at the positions that precede each of the last ``keep_r`` columns of the (trimmed) rows,
    [B, keep_r, ...], from one packed pass: the same values as ``logprobs.response_outputs``. Response columns that
    are padding get zeros (they are masked out downstream). ``routing``: the rows' recorded experts, packed alike."""
    index, positions = packed_rows(mask)
    if routing is not None:
        routing.packed(index).feed()
    packed = run(model, input_ids=ids.reshape(-1)[index].unsqueeze(0), position_ids=positions.unsqueeze(0),
                 attention_mask=None, use_cache=False)[0]
    rows, width = ids.shape
    # the packed slot of every [B, T] cell (a padding cell: -1), then of the column before each response column
    slot = torch.full((rows * width,), -1, dtype=torch.long, device=ids.device)
    slot[index] = torch.arange(len(index), device=ids.device)
    before = slot.view(rows, width)[:, width - keep_r - 1 : width - 1]
    real = mask[:, width - keep_r :].bool() & (before >= 0)
    out = packed.new_zeros((rows, keep_r, *packed.shape[1:]))
    out[real] = packed[before[real]]
    return out


class PackingCost(NamedTuple):
    """What decides packing for a model: how many attended pairs cost one position's linear work, and whether its
    attention computes only each packed sequence's own blocks (flash-attention varlen)."""

    pairs_per_position: float
    varlen: bool

    @classmethod
    def of(cls, model: nn.Module) -> PackingCost:
        config = model.config
        return cls(PAIRS_PER_POSITION_PER_HIDDEN * config.hidden_size,
                   str(getattr(config, "_attn_implementation", "")).startswith("flash"))


def packing_pays(mask: torch.Tensor, keep_r: int, shared_positions: float, cost: PackingCost) -> bool:
    """Whether one packed pass over these (trimmed) rows costs less than the shared-prompt pass computing
    ``shared_positions`` positions (``logprobs.forward_load``). Packing computes only real tokens; its attention
    covers the whole packed row (N^2 pairs) unless it is varlen (each sequence's own only)."""
    lengths = mask.sum(-1).double()
    n = float(lengths.sum())
    pairs = float((lengths**2).sum()) if cost.varlen else n * n
    rows, width = mask.shape
    shared_pairs = rows * keep_r * width  # each response token attends to the whole trimmed row
    rate = cost.pairs_per_position
    return n + pairs / rate < shared_positions + shared_pairs / rate
