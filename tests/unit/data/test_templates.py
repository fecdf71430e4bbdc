"""Prompt templates: placeholder checks and substitution."""

from __future__ import annotations

import pytest

from dockflow.config import DataConfig
from dockflow.data import TemplateError, apply_template, check_template, load_task


def test_apply_replaces_only_the_placeholder() -> None:
    tpl = "Q: {prompt}\nPut it in \\boxed{}.\nA:"
    assert apply_template(tpl, "What is 1 + 1?") == "Q: What is 1 + 1?\nPut it in \\boxed{}.\nA:"
    assert apply_template("{prompt}", "x") == "x"


@pytest.mark.parametrize("tpl", ["Question: {question}", "", "{prompt} and {prompt}", "{ prompt }"])
def test_bad_template_is_a_clear_error(tpl: str) -> None:
    with pytest.raises(TemplateError, match="data.prompt_template .*'\\{prompt\\}' placeholder"):
        check_template(tpl)


def test_load_task_checks_the_template() -> None:
    with pytest.raises(TemplateError, match="has no '\\{prompt\\}'"):
        load_task(DataConfig(prompt_template="Answer:"), seed=0)
