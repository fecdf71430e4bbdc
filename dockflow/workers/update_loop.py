"""The update loop every trainable worker (actor, critic) runs over the mini-batches it takes from the dock."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from tensordict import TensorDict

from dockflow.engines import LossFn, TrainingEngine


def train_epochs(
    engine: TrainingEngine, mini_batches: Iterable[TensorDict], loss_fn: LossFn, epochs: int, micro_batch_size: int
) -> dict[str, float]:
    """One optimizer step per mini-batch as each arrives (first epoch streams behind the producers), then
    ``epochs - 1`` more passes over the same mini-batches; returns metrics averaged over the steps."""
    seen: list[TensorDict] = []
    totals: dict[str, float] = {}
    steps = 0

    def step(mb: TensorDict) -> None:
        nonlocal steps
        for k, v in engine.train_mini_batch(mb, loss_fn, micro_batch_size).items():
            totals[k] = totals.get(k, 0.0) + v
        steps += 1

    for mb in mini_batches:
        seen.append(mb)
        step(mb)
    for _ in range(epochs - 1):
        for mb in seen:
            step(mb)
    return {k: v / max(steps, 1) for k, v in totals.items()}


def length_sorted(batch: TensorDict, micro_batch_size: int) -> TensorDict:
    """The mini-batch's rows sorted by response length, then total length, when it spans several micro-batches:
    each micro-batch then holds similar lengths and is cut to them (``engines/logprobs.py`` trims the columns
    that are padding in every row), instead of every micro-batch padding to the longest response."""
    rows = batch.batch_size[0]
    if rows <= micro_batch_size:
        return batch
    total = batch["attention_mask"].sum(-1)
    key = batch["response_mask"].sum(-1) * (batch["attention_mask"].shape[1] + 1) + total
    return batch[torch.argsort(key, stable=True)]
