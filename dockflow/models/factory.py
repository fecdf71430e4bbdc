"""Build, save and load causal LMs: the tiny Qwen2 (or Qwen3-MoE) policy, or any local Hugging Face model directory.

Nothing is downloaded: the tiny model is built from a ``Qwen2Config`` (``Qwen3MoeConfig``) and the local tokenizer;
``load_model_and_tokenizer`` reads only local files (``local_files_only=True``).

    tok = build_char_tokenizer()
    model = build_tiny_model(cfg.model.tiny, tok, seed=0)
    save_pretrained_dir(model, tok, "runs/x/model")
    model, tok = load_model_and_tokenizer("runs/x/model", dtype="float32")
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedTokenizerFast

from dockflow.config import TinyModelConfig
from dockflow.dtypes import torch_dtype

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

# The model classes and AutoTokenizer are imported where they are used: importing them costs a process about 3 s
# of CPU, and the reward worker, which only decodes with a saved tokenizer, never needs them.

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


class ModelFilesError(FileNotFoundError):
    """A model directory lacks files it needs; the message names the directory and the files."""


def tiny_model_config(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """The config of the tiny policy (``Qwen2Config``, or ``Qwen3MoeConfig`` for ``architecture: qwen3_moe``);
    vocabulary and special ids come from ``tokenizer``."""
    if cfg.hidden_size % cfg.num_heads or cfg.num_heads % cfg.num_kv_heads:
        raise ValueError(
            f"model.tiny: hidden_size={cfg.hidden_size} must be divisible by num_heads={cfg.num_heads}, "
            f"and num_heads by num_kv_heads={cfg.num_kv_heads}"
        )
    if cfg.architecture == "qwen3_moe" and cfg.num_experts_per_tok > cfg.num_experts:
        raise ValueError(
            f"model.tiny: num_experts_per_tok={cfg.num_experts_per_tok} must be at most num_experts={cfg.num_experts}"
        )
    moe = dict(
        head_dim=cfg.hidden_size // cfg.num_heads,
        num_experts=cfg.num_experts,
        num_experts_per_tok=cfg.num_experts_per_tok,
        moe_intermediate_size=cfg.moe_intermediate_size,
        norm_topk_prob=True,
    )
    from transformers import Qwen2Config, Qwen3MoeConfig

    config_class = Qwen3MoeConfig if cfg.architecture == "qwen3_moe" else Qwen2Config
    return config_class(
        **(moe if cfg.architecture == "qwen3_moe" else {}),
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def build_tiny_model(
    cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int, dtype: str | torch.dtype = "float32"
) -> PreTrainedModel:
    """A freshly initialised tiny Qwen2 (or Qwen3-MoE) causal LM; the init depends only on ``seed`` (global RNG
    untouched)."""
    config = tiny_model_config(cfg, tokenizer)
    from transformers import Qwen2ForCausalLM, Qwen3MoeForCausalLM

    model_class = Qwen3MoeForCausalLM if cfg.architecture == "qwen3_moe" else Qwen2ForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model = model.to(torch_dtype(dtype))
    _set_generation_ids(model, tokenizer)
    return model


def _set_generation_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    gen = model.generation_config
    gen.pad_token_id = tokenizer.pad_token_id
    gen.eos_token_id = tokenizer.eos_token_id
    if tokenizer.bos_token_id is not None:
        gen.bos_token_id = tokenizer.bos_token_id


def save_pretrained_dir(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    path: str | Path,
    extra_files: dict[str, str] | None = None,
) -> Path:
    """Save model + tokenizer (+ ``extra_files``: name -> text) as one HF directory, atomically.

    Everything is written to a sibling temp dir that is then renamed; an existing ``path`` is replaced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.replace(path, old / "x")
            os.replace(tmp, path)
            _rmtree(old)
        else:
            os.replace(tmp, path)
    finally:
        _rmtree(tmp)
    return path


def _rmtree(p: Path) -> None:
    shutil.rmtree(p, ignore_errors=True)


def missing_model_files(path: str | Path) -> list[str]:
    """What a loadable causal-LM directory lacks: 'config.json', weights, tokenizer files (empty if none)."""
    p = Path(path)
    missing = []
    if not (p / "config.json").is_file():
        missing.append("config.json")
    if not any((p / f).is_file() for f in WEIGHT_FILES) and not any(p.glob("*.safetensors")):
        missing.append("weights (" + " or ".join(WEIGHT_FILES[:1] + WEIGHT_FILES[2:3]) + ")")
    if not any((p / f).is_file() for f in TOKENIZER_FILES):
        missing.append("tokenizer (" + " or ".join(TOKENIZER_FILES) + ")")
    return missing


# Tokenizers saved from a plain ``tokenizers`` object. AutoTokenizer would pick the class of the model type
# (Qwen2Tokenizer for the tiny model), which rebuilds the pipeline and silently drops our pre-tokenizer.
_GENERIC_TOKENIZER_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}


def _tokenizer_from_dir(p: Path) -> PreTrainedTokenizerBase:
    config = p / "tokenizer_config.json"
    cls = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    if cls in _GENERIC_TOKENIZER_CLASSES and (p / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(p, local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(p, local_files_only=True)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load only the tokenizer of a local HF directory: left padding, EOS as pad if it has no pad token."""
    p = Path(path)
    if not p.is_dir() or not any((p / f).is_file() for f in TOKENIZER_FILES):
        raise ModelFilesError(
            f"no tokenizer in '{p}': it needs one of {', '.join(TOKENIZER_FILES)} (save one with save_pretrained)"
        )
    tokenizer = _tokenizer_from_dir(p)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelFilesError(f"tokenizer in '{p}' has neither a pad nor an eos token; add one to its config")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_model_dir(p: Path) -> None:
    """Raise ModelFilesError naming the directory and what it lacks unless it holds a loadable causal LM."""
    if not p.is_dir():
        raise ModelFilesError(f"model directory '{p}' does not exist: set model.path to a local HF model directory")
    missing = missing_model_files(p)
    if missing:
        raise ModelFilesError(
            f"model directory '{p}' is missing {', '.join(missing)}: it must hold a complete Hugging Face "
            "causal-LM checkpoint (save one with save_pretrained or download it first)"
        )


def load_model_and_tokenizer(
    path: str | Path, dtype: str | torch.dtype = "float32"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load any local HF causal-LM directory (tiny policy or e.g. a downloaded Qwen2.5-0.5B).

    The tokenizer pads on the left; if it has no pad token, EOS is used as pad. A tokenizer whose ids exceed the
    model's embedding rows raises TokenizerFitError (``dockflow.models.tokenizer_fit``).
    """
    p = Path(path)
    check_model_dir(p)
    tokenizer = load_tokenizer(p)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(p, local_files_only=True, dtype=torch_dtype(dtype))
    from dockflow.models.tokenizer_fit import TokenizerFitError, tokenizer_fit_problem

    problem = tokenizer_fit_problem(tokenizer, model.get_input_embeddings().num_embeddings)
    if problem is not None:  # a model staged from s3:// or the registry is checked here, where a worker loads it
        raise TokenizerFitError(f"model directory '{p}': {problem}")
    _set_generation_ids(model, tokenizer)
    return model, tokenizer


def load_critic(path: str | Path, dtype: str | torch.dtype = "float32") -> PreTrainedModel:
    """A critic on the policy's architecture: the policy's backbone weights and a new one-output token head.

    The head starts at zero (every value 0), so the first advantages are plain returns rather than noise;
    dropout is off so that training and inference see the same values.
    """
    p = Path(path)
    check_model_dir(p)
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(p, local_files_only=True, num_labels=1)
    config.classifier_dropout = 0.0
    critic = AutoModelForTokenClassification.from_pretrained(p, config=config, local_files_only=True, dtype=torch_dtype(dtype))
    with torch.no_grad():
        critic.score.weight.zero_()
        if critic.score.bias is not None:
            critic.score.bias.zero_()
    return critic
