"""The update loop every trainable worker (actor, critic) runs over the mini-batches it takes from the dock."""

from __future__ import annotations

from collections.abc import Iterable

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
