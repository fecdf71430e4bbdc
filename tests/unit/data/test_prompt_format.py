"""Prompt formats: the template alone, or a chat turn in the tokenizer's own chat template; dataset columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dockflow.config import load_config
from dockflow.data import Columns, Example, PromptFormat, TemplateError
from dockflow.data.loaders import DatasetError, load_examples
from dockflow.models.tokenizer import build_char_tokenizer, build_task_tokenizer


def test_plain_template_needs_no_tokenizer() -> None:
    assert PromptFormat("Q: {prompt}\nA:").render("1+1?") == "Q: 1+1?\nA:"


def test_chat_template_wraps_the_templated_prompt_in_turns() -> None:
    cfg = load_config("configs/grpo_arith.yaml", ["data.chat_template=true", "data.system_prompt=Be brief.",
                                                  "data.arithmetic.num_train=1000"])
    tok = build_task_tokenizer(cfg.data, cfg.run.seed, cfg.model.tiny.tokenizer_merges)
    text = PromptFormat.of(cfg.data).render("What is 1 + 2?", tok)
    assert text == "<|system|>Be brief.<|end|><|user|>What is 1 + 2?\nAnswer: <|end|><|assistant|>"
    ids = tok(text)["input_ids"]
    assert tok.convert_ids_to_tokens(ids[-1]) == "<|assistant|>"  # chat markers are single tokens
    assert tok.decode(ids, skip_special_tokens=True) == "Be brief.What is 1 + 2?\nAnswer: "


def test_chat_template_without_one_in_the_tokenizer_says_what_to_do() -> None:
    with pytest.raises(TemplateError, match="tokenizer has no chat template"):
        PromptFormat("{prompt}", chat=True).render("x", build_char_tokenizer())


def test_prompt_and_answer_keys_name_the_columns_and_the_rest_pass_through(tmp_path: Path) -> None:
    p = tmp_path / "code.jsonl"
    p.write_text(json.dumps({"question": "Write f.", "solution": "def f(): pass", "tests": "assert f() is None"}) + "\n")
    cols = Columns(prompt="question", answer="solution")
    assert load_examples(p, cols=cols) == [Example("Write f.", "def f(): pass", fields={"tests": "assert f() is None"})]
    p.write_text(json.dumps({"question": "Write f."}) + "\n")
    with pytest.raises(DatasetError, match=r"code.jsonl:1: missing field 'solution' \(every row needs 'question' and "):
        load_examples(p, cols=cols)
