"""Conversational datasets (TRL's format): prompts as lists of messages load from JSONL and Parquet, malformed
ones are refused with their row, they render through the tokenizer's chat template, and a config that cannot
render them says what to change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dockflow.config import load_config
from dockflow.data import Example, PromptFormat, TemplateError, load_task
from dockflow.data.loaders import DatasetError, load_examples
from dockflow.data.task_identity import examples_hash
from dockflow.models.tokenizer import build_task_tokenizer

SYSTEM = {"role": "system", "content": "Think first."}
ROWS = [
    {"prompt": [SYSTEM, {"role": "user", "content": "What is 2 + 3?"}], "solution": "5", "answer": "5"},
    {"prompt": [{"role": "user", "content": "What is 4 + 4?"}], "solution": "8", "answer": 8},
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_message_prompts_load_from_jsonl_and_parquet_with_their_columns(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    expected = [Example(r["prompt"], str(r["answer"]), fields={"solution": r["solution"]}) for r in ROWS]
    assert load_examples(_jsonl(tmp_path / "chat.jsonl", ROWS)) == expected
    pq.write_table(pa.Table.from_pylist([{**r, "answer": str(r["answer"])} for r in ROWS]), tmp_path / "chat.parquet")
    assert load_examples(tmp_path / "chat.parquet") == expected  # a list of structs reads back as dicts


@pytest.mark.parametrize(("prompt", "message"), [
    ([], "field 'prompt' is an empty list of messages"),
    (["What is 1 + 1?"], "message 0 is str, not an object with 'role' and 'content'"),
    ([{"role": "user"}], "message 0 needs a string 'content' (missing)"),
    ([{"role": "user", "content": "hi"}, {"role": "user", "content": ["a"]}], "message 1 needs a string 'content' (list)"),
    ([{"content": "hi"}], "message 0 needs a string 'role' (missing)"),
    ([{"role": " ", "content": "hi"}], "message 0 has an empty 'role'"),
])
def test_malformed_messages_name_the_row(tmp_path: Path, prompt: list, message: str) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", [ROWS[1], {"prompt": prompt, "answer": "2"}])
    with pytest.raises(DatasetError) as err:
        load_examples(path)
    assert str(err.value).startswith(f"{path}:2: ") and message in str(err.value)


def test_a_file_mixing_string_and_message_prompts_is_refused_at_the_first_that_differs(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "mixed.jsonl", [ROWS[0], ROWS[1], {"prompt": "What is 1 + 1?", "answer": "2"}])
    with pytest.raises(DatasetError, match=r"mixed.jsonl:3: the prompt is a string but the first row's is a list of"):
        load_examples(path)


def _file_config(tmp_path: Path, *overrides: str):
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": a + b}
            for a in range(5) for b in range(4)]
    path = _jsonl(tmp_path / "sums.jsonl", rows)
    return load_config("configs/grpo_arith.yaml", [
        "data.source=file", f"data.train_path={path}", f"data.test_path={path}", "data.arithmetic.num_val=4",
        "data.arithmetic.num_labeled=8", *overrides,
    ])


def test_messages_render_with_the_chat_template_and_no_prompt_template(tmp_path: Path) -> None:
    cfg = _file_config(tmp_path, "data.chat_template=true", "data.system_prompt=Be brief.")
    task = load_task(cfg.data, cfg.run.seed)
    tok = build_task_tokenizer(cfg.data, cfg.run.seed, cfg.model.tiny.tokenizer_merges)
    fmt = PromptFormat.of(cfg.data)
    assert fmt.render(task.train[0].prompt, tok) == (
        "<|system|>Be brief.<|end|><|user|>What is 1 + 0?<|end|><|assistant|>"  # data.system_prompt added
    )
    assert fmt.render(ROWS[0]["prompt"], tok) == (  # the row's own system turn wins over data.system_prompt
        "<|system|>Think first.<|end|><|user|>What is 2 + 3?<|end|><|assistant|>"
    )
    assert fmt.render("What is 1 + 0?", tok) == (  # a string prompt still gets the prompt template
        "<|system|>Be brief.<|end|><|user|>What is 1 + 0?\nAnswer: <|end|><|assistant|>"
    )
    with pytest.raises(TemplateError, match="the prompts are conversational .* set data.chat_template: true"):
        PromptFormat("{prompt}").render(ROWS[1]["prompt"])


@pytest.mark.parametrize(("overrides", "message"), [
    ((), r"sums.jsonl: the prompts are conversational \(lists of messages\), which only the tokenizer's chat "
         r"template can render: set data.chat_template: true"),
    (("data.chat_template=true", "data.prompt_template='Q: {prompt}'"),
     r"sums.jsonl: .* data.prompt_template 'Q: \{prompt\}' would be ignored: remove it"),
])
def test_a_config_that_cannot_render_messages_says_what_to_change(tmp_path: Path, overrides, message: str) -> None:
    cfg = _file_config(tmp_path, *overrides)
    with pytest.raises(TemplateError, match=message):
        load_task(cfg.data, cfg.run.seed)
    load_task(_file_config(tmp_path, "data.chat_template=true", "data.prompt_template='{prompt}'").data, 0)


def test_the_examples_hash_covers_the_messages() -> None:
    a = Example([{"role": "user", "content": "What is 2 + 3?"}], "5")
    b = Example([{"role": "user", "content": "What is 2 + 4?"}], "5")
    assert examples_hash([a]) != examples_hash([b])
    assert examples_hash([Example("x", "1")]) == examples_hash([Example("x", "1")])
