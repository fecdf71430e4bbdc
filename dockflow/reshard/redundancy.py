"""Redundant memory of naive resharding: the paper's Eq. (3) prediction and the measured value.

Eq. (3): ``R = GDP * (TW / UTP + EW / GEP)``, with TW / EW the bytes of the TP-split / expert weights, UTP
the update TP size, GDP / GEP the generation DP / EP sizes. Per device the bracket is what naive resharding
leaves behind: the old TP shard (``TW / UTP``) and the experts this device no longer serves (``EW / GEP``);
R multiplies it by GDP, the device count of the paper's Fig. 3 where generation TP is 1.

Eq. (3) has no FSDP term. For an FSDP-sharded update layout we apply it with every weight counted as
"split" (``TW`` := all weight bytes, ``EW`` := 0) and ``UTP`` := tp * dp, the total shard factor: under
naive resharding each rank then keeps its 1/(tp*dp) flat shard beside the gathered weights.

Eq. (3) has no pipeline term either. A stage holds 1/pp of the layers, so with pipeline stages the TP-split
weights are spread over tp * pp shards: ``UTP`` := tp * pp. A padded vocabulary (Megatron's, ``vocab_multiple``)
adds its zero rows, which naive resharding keeps resident beside the unpadded generation copy even at TP=1:
``PAD`` (the padding bytes of one full copy) counts with TW, ``R = GDP * ((TW + PAD) / (UTP * UPP) + EW / GEP)``.

Eq. (3)'s expert term ``EW / GEP`` is Fig. 3's case: the update experts are TP-split, so none is used in place and
a device keeps its whole expert shard, ``EW / (UEP * UTP)``, which equals ``EW / GEP`` there. With experts whole
(update TP 1, as megatron's MoE trains) naive resharding uses in place every expert a rank keeps serving, so the
term is the experts it holds and generation does not (``eq3_ep_per_rank``, docs/reshard.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from dockflow.reshard.layout import ParallelLayout
from dockflow.reshard.ledger import storage_bytes
from dockflow.reshard.rules import ModelPartition


def predicted_redundant_bytes(tw_bytes: float, ew_bytes: float, update_tp: int, gen_dp: int, gen_ep: int) -> float:
    """Eq. (3) as printed: R = GDP * (TW / UTP + EW / GEP), summed over the generation devices."""
    for name, value in (("update_tp", update_tp), ("gen_dp", gen_dp), ("gen_ep", gen_ep)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    return gen_dp * predicted_redundant_bytes_per_rank(tw_bytes, ew_bytes, update_tp, gen_ep)


def predicted_redundant_bytes_per_rank(tw_bytes: float, ew_bytes: float, update_tp: int, gen_ep: int) -> float:
    """The bracket of Eq. (3): one device's redundant bytes, TW / UTP + EW / GEP."""
    return tw_bytes / update_tp + ew_bytes / gen_ep


@dataclass(frozen=True)
class Eq3Inputs:
    """The terms of Eq. (3) for one model and pair of layouts."""

    tw_bytes: int
    ew_bytes: int
    update_tp: int
    gen_dp: int
    gen_ep: int
    pad_bytes: int = 0  # vocabulary padding of one full copy in the update layout
    update_pp: int = 1

    @property
    def total(self) -> float:
        return predicted_redundant_bytes(self.tw_bytes + self.pad_bytes, self.ew_bytes,
                                         self.update_tp * self.update_pp, self.gen_dp, self.gen_ep)

    @property
    def per_rank(self) -> float:
        """The bracket; with pipeline stages the mean over ranks (stages may hold unequal shares)."""
        return predicted_redundant_bytes_per_rank(self.tw_bytes + self.pad_bytes, self.ew_bytes,
                                                  self.update_tp * self.update_pp, self.gen_ep)


def eq3_inputs(partition: ModelPartition, update: ParallelLayout, gen: ParallelLayout) -> Eq3Inputs:
    """TW, EW and the sizes of Eq. (3) from a model's partition (FSDP: see the module docstring)."""
    if update.fsdp:
        total = sum(partition.nbytes(n) for n in partition.meta)
        return Eq3Inputs(total, 0, update.tp * update.dp, gen.dp, gen.ep)
    tw = sum(partition.nbytes(n) for n in partition.meta
             if update.tp > 1 and not partition.is_expert(n) and partition.kind(n).tp_dim is not None)
    ew = sum(partition.nbytes(n) for n in partition.meta if partition.is_expert(n))
    pad = sum(_padding_bytes(partition, n, update) for n in partition.meta if partition.kind(n).vocab)
    return Eq3Inputs(tw, ew, update.tp, gen.dp, gen.ep, pad, update.pp)


def _expert_range(layout: ParallelLayout, rank: int, experts: int) -> range:
    per = experts // layout.ep
    first = layout.coords(rank).ep * per
    return range(first, first + per)


def eq3_ep_per_rank(partition: ModelPartition, update: ParallelLayout, gen: ParallelLayout) -> list[float]:
    """Eq. (3) extended for EP, per rank: ``(TW + PAD) / (UTP * UPP)`` plus the expert bytes rank r's update shards
    hold that its generation shards do not use in place: ``EW / E * |S_u(r) - S_g(r)|`` with the experts whole (update
    TP 1; per-expert tensors, or stacked ones whose generation range lies inside the update's), else its whole expert
    shard ``EW / (UEP * UTP)``. S_u / S_g: the experts of r's EP rank in each layout. Generation TP 1, no pipeline."""
    if gen.tp != 1 or update.pp != 1:
        raise ValueError(f"eq3_ep_per_rank models generation TP 1 and update PP 1; got {gen} from {update}")
    inputs = eq3_inputs(partition, update, gen)
    dense = (inputs.tw_bytes + inputs.pad_bytes) / update.tp
    out = []
    for rank in range(update.size):
        kept = 0.0
        for name in partition.meta:
            kind = partition.kind(name)
            if kind.expert is None:
                continue
            nbytes = partition.nbytes(name)
            if kind.expert == "name":
                if partition.shard_map(name, update, rank) is None:
                    continue  # another EP rank's expert
                in_place = update.tp == 1 and partition.shard_map(name, gen, rank) is not None
                kept += 0 if in_place else nbytes / update.tp
                continue
            experts = partition.meta[name].shape[0]
            held, needed = _expert_range(update, rank, experts), _expert_range(gen, rank, experts)
            if update.tp == 1 and set(needed) <= set(held):
                kept += nbytes * (len(held) - len(needed)) / experts
            else:
                kept += nbytes / (update.ep * update.tp)
        out.append(dense + kept)
    return out


def _padding_bytes(partition: ModelPartition, name: str, layout: ParallelLayout) -> int:
    """Bytes of the zero rows ``layout`` pads the vocabulary-parallel ``name`` with (one full copy)."""
    rows = partition.meta[name].shape[0]
    multiple = layout.vocab_multiple * layout.tp
    return (-(-rows // multiple) * multiple - rows) * partition.nbytes(name) // rows


def measured_redundant_bytes(update_weights: Iterable[torch.Tensor], generation_weights: Iterable[torch.Tensor],
                             device: torch.device | str) -> int:
    """Weight bytes on ``device`` that generation does not use: the distinct storages of update and generation
    weights, less the bytes the generation weights themselves need."""
    generation = list(generation_weights)
    resident = storage_bytes([*update_weights, *generation], torch.device(device))
    needed = sum(t.numel() * t.element_size() for t in generation)
    return resident - needed
