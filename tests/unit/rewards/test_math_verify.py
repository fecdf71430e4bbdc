"""The math verifier: answer extraction rules and 1.0 / 0.0 scoring."""

from __future__ import annotations

import pytest

from dockflow.rewards import canonical_answer, extract_answer, format_reward, verify


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("42", "42"),
        ("  42  ", "42"),
        ("-38", "-38"),
        ("- 38", "-38"),
        ("+5", "5"),
        ("\u22125", "-5"),  # unicode minus
        ("\u20135", "-5"),  # en dash
        ("007", "7"),
        ("7", "007"),
        ("-0", "0"),
        ("0", "-0"),
        ("42 because 40 + 2", "42"),
        ("42<eos junk> 17", "42"),
        ("118\n118", "118"),
        ("The answer is \\boxed{42}.", "42"),
        ("first 3, so \\boxed{-12}", "-12"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{}{} 9}", "9"),
        ("1,234", "1234"),
        ("2.50", "2.5"),
        ("100", "100.0"),
        ("\uff14\uff12", "42"),  # full-width digits
        ("Paris", "paris"),
        ("  paris. ", "Paris"),
    ],
)
def test_correct_responses_score_one(response: str, answer: str) -> None:
    assert verify(response, answer) == 1.0


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("", "42"),
        ("   ", "0"),
        ("abc", "42"),
        ("<eos>", "1"),
        ("-42", "42"),
        ("42", "-42"),
        ("4 2", "42"),
        ("43", "42"),
        ("17 then 42", "42"),  # the first number counts
        ("42 \\boxed{41}", "42"),  # the box wins over the first number
        ("\\boxed{}", "0"),
        ("\\boxed{abc", "1"),  # unclosed box: no boxed answer, no number
        ("London", "Paris"),
        ("", "Paris"),
    ],
)
def test_wrong_or_garbage_responses_score_zero(response: str, answer: str) -> None:
    assert verify(response, answer) == 0.0


def test_extract_answer_returns_canonical_text_or_none() -> None:
    assert extract_answer("  - 05 apples") == "-5"
    assert extract_answer("x \\boxed{ +3 } y") == "3"
    assert extract_answer("no digits") is None
    assert extract_answer("") is None
    assert canonical_answer("-38") == "-38"
    assert canonical_answer("Paris") is None


def test_format_reward_wants_exactly_one_number() -> None:
    assert format_reward("-38") == 1.0
    assert format_reward(" 12 ") == 1.0
    assert format_reward("12 because") == 0.0
    assert format_reward("") == 0.0
    assert format_reward("--3") == 0.0
