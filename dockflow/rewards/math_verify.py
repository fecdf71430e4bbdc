"""Rule-based answer verification for math prompts: pull the answer out of a response and compare.

Rules (pure Python, no model):

* Unicode minus/dash signs and full-width signs and digits count as ASCII ('−5' is -5).
* If the response has ``\\boxed{...}``, the answer is the first number inside the last box (a model that
  writes a box means it as its final answer). Otherwise the answer is the FIRST number in the response:
  the tiny policy answers with the number and then EOS, so whatever follows is junk, not a revision.
* A number is an optional sign, optional spaces, digits (optionally grouped '1,234') and an optional
  decimal part: '- 5', '+5', '007', '2.50' parse; values compare numerically, so '007' == '7',
  '-0' == '0' and '2.50' == '2.5'.
* A reference answer that is not a number (a user dataset may have words) is compared as text:
  case-insensitive with whitespace collapsed and a final '.' or '!' dropped, against the box content or else the first line.

    verify("-38<junk>", "-38")        # 1.0
    verify("The answer is \\boxed{7}", "007")   # 1.0
    extract_answer("  - 5 apples")   # '-5'
"""

from __future__ import annotations

import re
from decimal import Decimal

_SIGN_MAP = str.maketrans(
    {"\u2212": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\ufe63": "-", "\uff0d": "-", "\uff0b": "+"}
    | {chr(0xFF10 + i): str(i) for i in range(10)}
)
_NUMBER = re.compile(r"([+-]?)[ \t]*(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?")
_BOXED = "\\boxed{"


def _normalize(text: str) -> str:
    return text.translate(_SIGN_MAP)


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces allowed), or None."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def _canonical_number(sign: str, digits: str, frac: str | None) -> str:
    value = Decimal(digits.replace(",", "") + (frac or ""))
    if sign == "-":
        value = -value
    if value == 0:
        return "0"
    return format(value.normalize(), "f")


def _first_number(text: str) -> str | None:
    m = _NUMBER.search(text)
    return _canonical_number(*m.groups()) if m else None


def canonical_answer(answer: str) -> str | None:
    """The canonical number text of a reference answer, or None if it is not a plain number."""
    text = _normalize(answer).strip()
    m = _NUMBER.fullmatch(text)
    return _canonical_number(*m.groups()) if m else None


def extract_answer(text: str) -> str | None:
    """The canonical number a response answers with (see module rules), or None if it has none."""
    text = _normalize(text)
    boxed = _last_boxed(text)
    if boxed is not None:
        return _first_number(boxed)
    return _first_number(text)


def _text_key(text: str) -> str:
    return " ".join(text.split()).lower().rstrip(".!")


def verify(response: str, answer: str) -> float:
    """1.0 if ``response`` answers ``answer`` (numerically, or as text for non-numeric answers), else 0.0."""
    want = canonical_answer(answer)
    if want is not None:
        return 1.0 if extract_answer(response) == want else 0.0
    norm = _normalize(response)
    boxed = _last_boxed(norm)
    got = boxed if boxed is not None else (norm.strip().splitlines() or [""])[0]
    return 1.0 if _text_key(got) == _text_key(_normalize(answer)) and got.strip() else 0.0


def format_reward(response: str) -> float:
    """1.0 if the response is exactly one well-formed number (surrounding whitespace allowed), else 0.0."""
    text = _normalize(response).strip()
    return 1.0 if text and _NUMBER.fullmatch(text) else 0.0
