"""The local character tokenizer: round trip, special tokens, left padding, HF save/load."""

from __future__ import annotations

import string
from pathlib import Path

from transformers import AutoTokenizer

from dockflow.models import build_char_tokenizer, load_tokenizer


def test_round_trip_every_task_character() -> None:
    tok = build_char_tokenizer()
    text = string.printable + "What is 47 - 85?\n-38 \u2212"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert len(ids) == len(text) + 1  # one token per character
    assert tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_special_tokens_and_unknown_chars() -> None:
    tok = build_char_tokenizer()
    ids = {tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id}
    assert len(ids) == 4
    assert tok("é", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]
    ans = tok("-38", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tok.decode(ans, skip_special_tokens=True) == "-38"


def test_left_padding_for_generation() -> None:
    tok = build_char_tokenizer()
    enc = tok(["a", "abcd"], padding=True, return_tensors="pt")
    assert enc["input_ids"][0].tolist()[:3] == [tok.pad_token_id] * 3
    assert enc["attention_mask"][0].tolist() == [0, 0, 0, 1, 1]


def test_save_and_load_as_hf_tokenizer(tmp_path: Path) -> None:
    tok = build_char_tokenizer()
    tok.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    for loaded in (AutoTokenizer.from_pretrained(tmp_path, local_files_only=True), load_tokenizer(tmp_path)):
        text = "What is 9 - 10?"
        assert loaded(text)["input_ids"] == tok(text)["input_ids"]
        assert loaded.padding_side == "left"
        assert (loaded.pad_token_id, loaded.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
        assert len(loaded) == len(tok)


def test_learned_merges_keep_digits_single_and_survive_save_load(tmp_path):
    corpus = [f"What is {a} + {b}?\nAnswer: {a + b}" for a in range(30) for b in range(30)]
    tok = build_char_tokenizer(corpus, num_merges=32)
    text = "What is 47 + 85?\nAnswer: "
    ids = tok(text)["input_ids"]
    assert len(ids) < len(build_char_tokenizer()(text)["input_ids"])
    assert [t for t in tok.convert_ids_to_tokens(ids) if any(c.isdigit() for c in t)] == ["4", "7", "8", "5"]
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again(text)["input_ids"] == ids
    assert again.decode(ids, skip_special_tokens=True) == text
