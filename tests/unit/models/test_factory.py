"""Tiny model factory and HF directory save/load, including clear errors for incomplete directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dockflow.config import TinyModelConfig
from dockflow.models import (
    ModelFilesError,
    build_tiny_model,
    load_model_and_tokenizer,
    load_tokenizer,
    save_pretrained_dir,
)


def test_builds_a_qwen2_with_the_tokenizer_vocab(micro_cfg, char_tok) -> None:
    model = build_tiny_model(micro_cfg, char_tok, seed=0)
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(char_tok)
    assert model.generation_config.eos_token_id == char_tok.eos_token_id
    enc = char_tok(["What is 1 + 2?"], return_tensors="pt")
    assert model(**enc).logits.shape == (1, enc["input_ids"].shape[1], len(char_tok))


def test_builds_a_qwen3_moe_whose_parameters_the_reshard_rules_cover(micro_cfg, char_tok) -> None:
    from dockflow.reshard import ModelPartition, param_meta

    cfg = micro_cfg.model_copy(update={"architecture": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2})
    model = build_tiny_model(cfg, char_tok, seed=0)
    assert model.config.model_type == "qwen3_moe" and model.config.num_experts == 4
    enc = char_tok(["What is 1 + 2?"], return_tensors="pt")
    assert model(**enc).logits.shape == (1, enc["input_ids"].shape[1], len(char_tok))
    kinds = ModelPartition(param_meta(model)).kinds  # raises on a name no rule covers
    assert any(k.startswith("stacked_expert") for k in kinds.values())
    with pytest.raises(ValueError, match="num_experts_per_tok=5"):
        build_tiny_model(cfg.model_copy(update={"num_experts_per_tok": 5}), char_tok, seed=0)


def test_init_depends_only_on_seed_and_leaves_global_rng(micro_cfg, char_tok) -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_tiny_model(micro_cfg, char_tok, seed=1)
    assert torch.equal(torch.rand(1), before)
    b = build_tiny_model(micro_cfg, char_tok, seed=1)
    c = build_tiny_model(micro_cfg, char_tok, seed=2)
    pa, pb, pc = (next(m.model.layers[0].parameters()) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_bad_head_counts_are_clear_errors(char_tok) -> None:
    with pytest.raises(ValueError, match="hidden_size=30 must be divisible by num_heads=4"):
        build_tiny_model(TinyModelConfig(hidden_size=30), char_tok, seed=0)


def test_save_and_load_round_trip(tmp_path: Path, micro_cfg, char_tok) -> None:
    model = build_tiny_model(micro_cfg, char_tok, seed=0)
    path = save_pretrained_dir(model, char_tok, tmp_path / "m", extra_files={"note.json": "{}"})
    assert {"config.json", "model.safetensors", "tokenizer.json", "note.json"} <= {p.name for p in path.iterdir()}
    save_pretrained_dir(model, char_tok, path)  # overwriting an existing dir works
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temp dirs left behind
    loaded, tok = load_model_and_tokenizer(path)
    enc = tok(["What is 3 + 4?", "What is 10 - 2?"], return_tensors="pt", padding=True)
    torch.testing.assert_close(loaded(**enc).logits, model(**enc).logits)
    half, _ = load_model_and_tokenizer(path, dtype="bfloat16")
    assert half.dtype == torch.bfloat16


def test_crash_while_saving_leaves_nothing(tmp_path: Path, micro_cfg, char_tok) -> None:
    model = build_tiny_model(micro_cfg, char_tok, seed=0)
    with pytest.raises(FileNotFoundError):
        save_pretrained_dir(model, char_tok, tmp_path / "m", extra_files={"no/such/dir.json": "{}"})
    assert list(tmp_path.iterdir()) == []


def test_missing_files_are_named(tmp_path: Path, micro_cfg, char_tok) -> None:
    with pytest.raises(ModelFilesError, match="does not exist"):
        load_model_and_tokenizer(tmp_path / "nope")
    path = save_pretrained_dir(build_tiny_model(micro_cfg, char_tok, seed=0), char_tok, tmp_path / "m")
    (path / "model.safetensors").unlink()
    (path / "tokenizer.json").unlink()
    with pytest.raises(ModelFilesError) as err:
        load_model_and_tokenizer(path)
    msg = str(err.value)
    assert str(path) in msg and "weights" in msg and "tokenizer" in msg and "config.json" not in msg
    (path / "config.json").unlink()
    with pytest.raises(ModelFilesError, match="missing config.json"):
        load_model_and_tokenizer(path)
    with pytest.raises(ModelFilesError, match="no tokenizer in"):
        load_tokenizer(path)


def test_tokenizer_without_pad_gets_eos_as_pad(tmp_path: Path, char_tok) -> None:
    char_tok.save_pretrained(tmp_path)
    cfg_file = tmp_path / "tokenizer_config.json"
    conf = json.loads(cfg_file.read_text())
    conf.pop("pad_token", None)
    cfg_file.write_text(json.dumps(conf))
    tok = load_tokenizer(tmp_path)
    assert tok.pad_token == tok.eos_token == "<eos>"
