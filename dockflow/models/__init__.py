"""Models: the locally built tokenizer (characters, plus BPE merges for the tiny model), the tiny Qwen2
factory, HF directory load/save, a base model's identity (the SFT warm start that trains them is
``dockflow.flow.sft``; greedy accuracy is ``dockflow.eval.greedy``). Nothing here downloads anything.

    from dockflow.models import build_char_tokenizer, build_tiny_model, load_model_and_tokenizer
    tok = build_char_tokenizer()
    model = build_tiny_model(cfg.model.tiny, tok, seed=cfg.run.seed)
"""

from __future__ import annotations

from dockflow.models.factory import (
    ModelFilesError,
    build_tiny_model,
    load_critic,
    load_model_and_tokenizer,
    load_tokenizer,
    missing_model_files,
    save_pretrained_dir,
    tiny_model_config,
)
from dockflow.models.tokenizer import build_char_tokenizer

__all__ = [
    "ModelFilesError",
    "build_char_tokenizer",
    "build_tiny_model",
    "load_critic",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "missing_model_files",
    "save_pretrained_dir",
    "tiny_model_config",
]
