"""A character-level tokenizer built locally (nothing downloaded), wrapped as an HF fast tokenizer.

Every printable ASCII character (digits, letters, punctuation, space, tab, newline) plus a few Unicode
signs is one token; anything else maps to ``<unk>``. Special tokens: ``<pad>`` (0), ``<bos>`` (1, added in
front of every encoded text), ``<eos>`` (2), ``<unk>`` (3). Padding is on the left, for batched
generation. It saves and loads like any HF tokenizer::

    tok = build_char_tokenizer()
    tok.save_pretrained("out/model")
    tok = AutoTokenizer.from_pretrained("out/model", local_files_only=True)
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, processors
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
EXTRA_CHARS = "\u2212\u00d7\u00f7"  # unicode minus, times, divide


def char_vocab() -> dict[str, int]:
    """Token -> id: the special tokens, then each character once, in a fixed order."""
    chars = list(dict.fromkeys(string.printable + EXTRA_CHARS))
    return {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *chars])}


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer as a ``PreTrainedTokenizerFast`` with pad/bos/eos/unk set."""
    vocab = char_vocab()
    # A BPE model without merges and without a pre-tokenizer splits text into single characters.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.add_special_tokens(list(SPECIAL_TOKENS))
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=4096,
    )
