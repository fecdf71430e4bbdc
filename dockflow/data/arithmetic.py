"""Seeded generator of a verifiable arithmetic task: "What is 47 - 85?" -> "-38".

Operands are drawn uniformly from ``0 .. 10**digits - 1`` and operators uniformly from ``ops``. Every
problem is a triple ``(a, op, b)``; the splits are disjoint by that triple. Problems are drawn as one
seeded stream of distinct triples: the first ``num_test`` are the test split, the next ``num_val`` the
validation split, the rest the train split, so the test set depends only on (seed, digits, ops) and
does not move when the other sizes change. ``labeled`` is the first ``num_labeled`` train problems.

When the train split asks for more problems than remain in the space (2-digit +/- has 20,000 triples),
every remaining triple is used once and the rest of the train split repeats them in seeded order.

    data = generate_arithmetic(ArithmeticConfig(digits=2), seed=0)
    data.test[0]   # Example(prompt='What is 12 + 7?', answer='19')
"""

from __future__ import annotations

import random

from dockflow.config import ArithmeticConfig
from dockflow.data.example import Example, TaskData


def problem_space_size(cfg: ArithmeticConfig) -> int:
    """Number of distinct (a, op, b) triples the config can produce."""
    return (10**cfg.digits) ** 2 * len(set(cfg.ops))


def make_example(a: int, op: str, b: int) -> Example:
    """The prompt and exact answer of one problem."""
    value = a + b if op == "+" else a - b
    return Example(prompt=f"What is {a} {op} {b}?", answer=str(value))


def _decode(index: int, base: int, ops: list[str]) -> tuple[int, str, int]:
    index, op_i = divmod(index, len(ops))
    a, b = divmod(index, base)
    return a, ops[op_i], b


def _distinct_stream(rng: random.Random, space: int, count: int) -> list[int]:
    """``count`` distinct indices of ``range(space)`` in seeded order (rejection sampling, stable prefix)."""
    seen: set[int] = set()
    out: list[int] = []
    while len(out) < count:
        i = rng.randrange(space)
        if i not in seen:
            seen.add(i)
            out.append(i)
    return out


def generate_arithmetic(cfg: ArithmeticConfig, seed: int) -> TaskData:
    """Build the train / labeled / val / test splits; deterministic given ``cfg`` and ``seed``."""
    ops = sorted(set(cfg.ops))
    space = problem_space_size(cfg)
    reserved = cfg.num_test + cfg.num_val
    if reserved >= space:
        raise ValueError(
            f"data.arithmetic: num_test + num_val = {reserved} leaves no train problems out of the {space} "
            f"distinct {cfg.digits}-digit problems with ops {ops}; raise digits or lower num_test/num_val"
        )
    if cfg.num_labeled > cfg.num_train:
        raise ValueError(
            f"data.arithmetic.num_labeled={cfg.num_labeled} exceeds num_train={cfg.num_train}: "
            "labeled problems are a subset of the train split"
        )
    unique_train = min(cfg.num_train, space - reserved)
    if cfg.num_labeled > unique_train:
        raise ValueError(
            f"data.arithmetic.num_labeled={cfg.num_labeled} exceeds the {unique_train} distinct train problems "
            "left after the test and val splits; lower num_labeled or raise digits"
        )
    rng = random.Random(f"arithmetic:{seed}")
    stream = _distinct_stream(rng, space, reserved + unique_train)
    base = 10**cfg.digits
    examples = [make_example(*_decode(i, base, ops)) for i in stream]
    test = examples[: cfg.num_test]
    val = examples[cfg.num_test : reserved]
    train = examples[reserved:]
    if cfg.num_train > len(train):
        train = train + rng.choices(train, k=cfg.num_train - len(train))
    return TaskData(train=train, labeled=train[: cfg.num_labeled], val=val, test=test)
