"""How a mini-batch is cut into micro-batches: a fixed number of rows, or as many rows as fit a token budget.

A micro-batch's memory and compute follow its padded size: its rows times its longest row (each micro-batch is cut
to its own longest prompt and response, ``engines/logprobs.py``). With samples counted, one micro-batch of
4,096-token responses costs many times one of 200-token ones, and peak memory follows the longest rows. With
``train.max_tokens_per_micro_batch`` a micro-batch takes consecutive rows while rows x longest row stays within the
budget (at least one row), as verl's ``use_dynamic_bsz``, NeMo-RL's dynamic batching and slime's
``--use-dynamic-batch-size`` do; rows sorted by length first (``train.seqlen_balance``) make the cuts tight. Every
recipe's loss is normalised by the whole mini-batch (its tokens, or Dr. GRPO's constant), so any cut gives the same
gradient.

    micro_batch_bounds(lengths=[3, 9, 9, 40], micro_batch_size=2, max_tokens=None)  # [(0, 2), (2, 4)]
    micro_batch_bounds(lengths=[3, 9, 9, 40], micro_batch_size=2, max_tokens=30)    # [(0, 3), (3, 4)]
"""

from __future__ import annotations

from collections.abc import Sequence


def micro_batch_bounds(lengths: Sequence[int], micro_batch_size: int,
                       max_tokens: int | None) -> list[tuple[int, int]]:
    """Row ranges [start, end) of the micro-batches of rows with these token ``lengths``: ``micro_batch_size`` rows
    each, or with ``max_tokens`` as many consecutive rows as keep rows x longest row within it (a row longer than
    the budget is a micro-batch of its own)."""
    rows = len(lengths)
    if max_tokens is None:
        return [(i, min(i + micro_batch_size, rows)) for i in range(0, rows, micro_batch_size)]
    bounds: list[tuple[int, int]] = []
    start, longest = 0, 0
    for row, length in enumerate(lengths):
        widest = max(longest, length)
        if row > start and (row + 1 - start) * widest > max_tokens:  # this row starts the next micro-batch
            bounds.append((start, row))
            start, widest = row, length
        longest = widest
    if rows:
        bounds.append((start, rows))
    return bounds
