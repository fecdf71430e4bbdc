"""The arithmetic generator: determinism, correct answers, disjoint splits, space exhaustion."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dockflow.config import ArithmeticConfig, DataConfig
from dockflow.data import load_task
from dockflow.data.arithmetic import generate_arithmetic, problem_space_size

PROMPT = re.compile(r"What is (\d+) ([+-]) (\d+)\?")


def _triple(prompt: str) -> tuple[int, str, int]:
    m = PROMPT.fullmatch(prompt)
    assert m, prompt
    return int(m[1]), m[2], int(m[3])


def test_same_seed_same_splits_other_seed_differs() -> None:
    cfg = ArithmeticConfig(num_train=300, num_labeled=50, num_val=40, num_test=60)
    a, b, c = generate_arithmetic(cfg, 1), generate_arithmetic(cfg, 1), generate_arithmetic(cfg, 2)
    assert a == b
    assert a.test != c.test and a.train != c.train


def test_answers_are_exact_and_operands_in_range() -> None:
    cfg = ArithmeticConfig(digits=3, num_train=500, num_labeled=10, num_val=10, num_test=100)
    data = generate_arithmetic(cfg, 0)
    ops_seen = set()
    for ex in data.train + data.test:
        a, op, b = _triple(ex.prompt)
        assert 0 <= a < 1000 and 0 <= b < 1000
        assert int(ex.answer) == (a + b if op == "+" else a - b)
        ops_seen.add(op)
    assert ops_seen == {"+", "-"}
    assert any(int(ex.answer) < 0 for ex in data.train)


def test_splits_are_disjoint_and_labeled_is_train_prefix() -> None:
    data = load_task(DataConfig(), seed=0)
    assert (len(data.train), len(data.labeled), len(data.val), len(data.test)) == (20000, 900, 200, 500)
    train, val, test = ({_triple(e.prompt) for e in split} for split in (data.train, data.val, data.test))
    assert not (train & test) and not (train & val) and not (val & test)
    assert len(test) == 500 and len(val) == 200
    assert data.labeled == data.train[:900]
    assert len({_triple(e.prompt) for e in data.labeled}) == 900


def test_test_split_does_not_move_when_other_sizes_change() -> None:
    small = generate_arithmetic(ArithmeticConfig(num_train=100, num_labeled=10, num_val=20), 3)
    large = generate_arithmetic(ArithmeticConfig(num_train=5000, num_labeled=500, num_val=20), 3)
    assert small.test == large.test and small.val == large.val


def test_exhausted_space_repeats_train_problems_but_stays_disjoint() -> None:
    cfg = ArithmeticConfig(digits=1, ops=["+"], num_train=200, num_labeled=50, num_val=10, num_test=10)
    assert problem_space_size(cfg) == 100
    data = generate_arithmetic(cfg, 0)
    train = [_triple(e.prompt) for e in data.train]
    assert len(train) == 200 and len(set(train)) == 80
    held = {_triple(e.prompt) for e in data.val + data.test}
    assert not set(train) & held


def test_too_small_space_is_an_error_naming_the_keys() -> None:
    cfg = ArithmeticConfig(digits=1, ops=["+"], num_test=90, num_val=10)
    with pytest.raises(ValueError, match="num_test \\+ num_val = 100"):
        generate_arithmetic(cfg, 0)
    with pytest.raises(ValueError, match="num_labeled"):
        generate_arithmetic(ArithmeticConfig(num_train=10, num_labeled=20), 0)


@settings(max_examples=25, deadline=None)
@given(
    digits=st.integers(1, 3),
    ops=st.sampled_from([["+"], ["-"], ["+", "-"]]),
    n_test=st.integers(1, 40),
    n_val=st.integers(0, 40),
    n_train=st.integers(1, 300),
    seed=st.integers(0, 10**6),
)
def test_disjoint_for_any_config(digits: int, ops: list[str], n_test: int, n_val: int, n_train: int, seed: int) -> None:
    cfg = ArithmeticConfig(digits=digits, ops=ops, num_test=n_test, num_val=n_val, num_train=n_train, num_labeled=0)
    if n_test + n_val >= problem_space_size(cfg):
        return
    data = generate_arithmetic(cfg, seed)
    train, val, test = ({_triple(e.prompt) for e in s} for s in (data.train, data.val, data.test))
    assert len(data.train) == n_train and len(test) == n_test and len(val) == n_val
    assert not (train & test) and not (train & val) and not (val & test)
