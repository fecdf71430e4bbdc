"""Tasks from reasoning-gym's procedural generators (PyPI ``reasoning-gym``; nothing is downloaded).

Entries come from ``reasoning_gym.create_dataset(name, seed=..., size=..., **options)``. Each becomes an
``Example`` whose answer is a reference solution and whose ``fields["metadata"]`` is the entry's metadata
(plain JSON types), which reasoning-gym's scorer needs (``dockflow.rewards.reasoning_gym_scorer``).

Countdown gets a compact prompt for a tiny model's short context ("Make 24 from 2 3 4.", about 20 characters
instead of reasoning-gym's 400-character question) and, as the SFT label, the first solution that takes the
numbers in the prompt's order, left to right ("2*3*4"; the generator's own expression when there is none): one
canonical form is far easier for a tiny model to learn from few labels than sympy's reordered printing. The
scorer accepts any solution. Other tasks keep reasoning-gym's question and answer.

As for the arithmetic task, entries are drawn as one seeded stream of distinct problems (countdown: the same
numbers, in any order, and target): the first ``num_test`` are the test split, the next ``num_val`` the
validation split, the rest the train split, so the test set depends only on (seed, name, options). A small
problem space fills the train split by repeating its distinct problems in seeded order.

    data = generate_reasoning_gym(ReasoningGymConfig(), seed=0)
    data.test[0]   # Example(prompt='Make 39 from 47 37 45.', answer='47+37-45', fields={'metadata': {...}})
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from fractions import Fraction
from functools import lru_cache
from typing import Any

from dockflow.config.data import ReasoningGymConfig
from dockflow.data.example import Example, TaskData

# Draw at most this many entries per distinct problem asked for, and stop after this many draws in a row that
# bring no new problem: a small problem space ends the stream early instead of drawing it dry.
_DRAWS_PER_PROBLEM = 3
_MAX_REPEATS_IN_A_ROW = 1000


def countdown_prompt(numbers: list[int], target: int) -> str:
    """The compact countdown prompt: ``Make 24 from 2 3 4.``"""
    return f"Make {target} from {' '.join(str(n) for n in numbers)}."


def left_to_right_solution(numbers: list[int], target: int, operators: str = "+-*/") -> str | None:
    """The first expression over ``numbers`` in their order, evaluated left to right (``operators`` tried in
    that order, parentheses only where precedence needs them), that equals ``target``; None if there is none."""
    for ops in itertools.product(operators, repeat=len(numbers) - 1):
        value, text, flat = Fraction(numbers[0]), str(numbers[0]), True  # flat: no top-level + or - in text
        for op, n in zip(ops, numbers[1:], strict=True):
            if op == "/" and n == 0:
                break
            if op in "*/" and not flat:
                text, flat = f"({text})", True
            flat = flat and op in "*/"
            value = {"+": value + n, "-": value - n, "*": value * n, "/": value / n if n else value}[op]
            text = f"{text}{op}{n}"
        else:
            if value == target:
                return text
    return None


def _plain(obj: Any) -> Any:
    """JSON types only (tuples become lists), so the metadata pickles and logs anywhere."""
    return json.loads(json.dumps(obj))


def entry_example(name: str, entry: dict[str, Any], short_prompt: bool = True, operators: str = "+-*/") -> Example:
    """One reasoning-gym entry as an ``Example`` carrying its metadata (countdown's reference: the first
    left-to-right solution over the task's ``operators``, else the generator's own)."""
    meta = _plain(entry["metadata"])
    if name == "countdown" and short_prompt:
        ref = left_to_right_solution(meta["numbers"], meta["target"], operators)
        return Example(
            prompt=countdown_prompt(meta["numbers"], meta["target"]),
            answer=ref or str(entry["answer"]).replace(" ", ""),
            fields={"metadata": meta},
        )
    return Example(prompt=str(entry["question"]), answer=str(entry["answer"]), fields={"metadata": meta})


def _problem_key(name: str, ex: Example) -> str:
    meta = ex.fields["metadata"]
    if name == "countdown":  # the same numbers in another order is the same problem
        return f"{sorted(meta['numbers'])}->{meta['target']}"
    return ex.prompt


def _stream_seed(name: str, seed: int) -> int:
    # reasoning-gym seeds entry i with seed + i, so nearby run seeds would share entries: hash instead.
    return int.from_bytes(hashlib.sha256(f"reasoning_gym:{name}:{seed}".encode()).digest()[:4], "big")


def _distinct_examples(cfg: ReasoningGymConfig, seed: int, count: int) -> list[Example]:
    """Up to ``count`` distinct problems, in stream order (fewer if the space runs out first)."""
    import reasoning_gym

    draws = count * _DRAWS_PER_PROBLEM
    try:
        dataset = reasoning_gym.create_dataset(cfg.name, seed=_stream_seed(cfg.name, seed), size=draws, **cfg.options)
    except (TypeError, ValueError, AssertionError) as err:
        raise ValueError(f"data.reasoning_gym: reasoning-gym cannot build {cfg.name!r} with options "
                         f"{cfg.options}: {err}") from err
    operators = "".join(cfg.options.get("operators", "+-*/"))
    seen: set[str] = set()
    out: list[Example] = []
    repeats = 0
    for i in range(draws):
        ex = entry_example(cfg.name, dataset[i], cfg.short_prompt, operators)
        key = _problem_key(cfg.name, ex)
        if key in seen:
            repeats += 1
            if repeats >= _MAX_REPEATS_IN_A_ROW:
                break
            continue
        seen.add(key)
        out.append(ex)
        repeats = 0
        if len(out) == count:
            break
    return out


@lru_cache(maxsize=4)
def _generate(cfg_json: str, seed: int) -> TaskData:
    cfg = ReasoningGymConfig.model_validate_json(cfg_json)
    if cfg.num_labeled > cfg.num_train:
        raise ValueError(
            f"data.reasoning_gym.num_labeled={cfg.num_labeled} exceeds num_train={cfg.num_train}: "
            "labeled problems are a subset of the train split"
        )
    reserved = cfg.num_test + cfg.num_val
    examples = _distinct_examples(cfg, seed, reserved + cfg.num_train)
    train = examples[reserved:]
    if len(train) < max(cfg.num_labeled, 1):
        raise ValueError(
            f"data.reasoning_gym: {cfg.name} with options {cfg.options} has only {len(examples)} distinct problems "
            f"(as far as the generator's draws show); num_test + num_val = {reserved} leaves "
            f"{len(train)} for train, fewer than num_labeled={cfg.num_labeled}: widen the options or lower the sizes"
        )
    if cfg.num_train > len(train):
        rng = random.Random(f"reasoning_gym:{seed}")
        train = train + rng.choices(train, k=cfg.num_train - len(train))
    return TaskData(train=train, labeled=train[: cfg.num_labeled], val=examples[cfg.num_test : reserved],
                    test=examples[: cfg.num_test])


def generate_reasoning_gym(cfg: ReasoningGymConfig, seed: int) -> TaskData:
    """Build the train / labeled / val / test splits; deterministic given ``cfg`` and ``seed`` (cached per
    process: several parts of a run load the same task)."""
    data = _generate(cfg.model_dump_json(), seed)
    return TaskData(train=list(data.train), labeled=list(data.labeled), val=list(data.val), test=list(data.test))
