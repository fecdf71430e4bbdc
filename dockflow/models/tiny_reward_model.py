"""A tiny reward model built locally: a real ``Qwen2ForSequenceClassification`` (one label) from a small config.

For tests, docs and trying ``reward.models`` without downloading anything; its scores are those of a randomly
initialised head, so it exercises the machinery, not a preference::

    from dockflow.models.tiny_reward_model import build_tiny_reward_model
    build_tiny_reward_model("models/tiny-rm")                    # character tokenizer
    build_tiny_reward_model("models/tiny-rm", "runs/x/model")    # the tokenizer of a model directory

or from a shell: ``python -m dockflow.models.tiny_reward_model models/tiny-rm``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForSequenceClassification

from dockflow.models.factory import load_tokenizer, save_pretrained_dir
from dockflow.models.tokenizer import build_char_tokenizer


def build_tiny_reward_model(
    out_dir: str | Path,
    tokenizer: PreTrainedTokenizerBase | str | Path | None = None,
    *,
    hidden_size: int = 32,
    num_layers: int = 2,
    max_position_embeddings: int = 512,
    seed: int = 0,
) -> Path:
    """Save a freshly initialised one-label Qwen2 sequence classifier and its tokenizer to ``out_dir``.

    ``tokenizer``: a tokenizer, a local model directory to take it from, or None for the character tokenizer.
    The weights depend only on ``seed`` (the global RNG is untouched). Returns ``out_dir``.
    """
    if tokenizer is None:
        tokenizer = build_char_tokenizer()
    elif not isinstance(tokenizer, PreTrainedTokenizerBase):
        tokenizer = load_tokenizer(tokenizer)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        num_labels=1,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,  # the head scores the last non-pad token
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)
    return save_pretrained_dir(model, tokenizer, out_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build a tiny one-label reward model locally (nothing downloaded).")
    parser.add_argument("out_dir", help="directory to write (replaced if it exists)")
    parser.add_argument("--tokenizer", default=None, help="model directory whose tokenizer to use (default: characters)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build_tiny_reward_model(args.out_dir, args.tokenizer, seed=args.seed))


if __name__ == "__main__":
    main()
