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

import re
import string
from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from dockflow.config.data import DataConfig
from dockflow.config.sections import CheckpointConfig
from dockflow.models.chat_template import CHAT_TOKENS, END_OF_TURN, TINY_CHAT_TEMPLATE, TOOL_TOKENS

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
EXTRA_CHARS = "\u2212\u00d7\u00f7"  # unicode minus, times, divide


def char_vocab() -> dict[str, int]:
    """Token -> id: the special tokens, then each character once, in a fixed order."""
    chars = list(dict.fromkeys(string.printable + EXTRA_CHARS))
    return {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *chars])}


def _char_core() -> Tokenizer:
    # A BPE model without merges and without a pre-tokenizer splits text into single characters.
    return Tokenizer(models.BPE(vocab=char_vocab(), merges=[], unk_token="<unk>"))


def _learned_core(corpus: Iterable[str], num_merges: int) -> Tokenizer:
    """BPE over the character alphabet with ``num_merges`` merges learned from ``corpus``.

    Digits are split off one by one before BPE (as Qwen and LLaMA tokenizers do), so numbers are always
    spelled digit by digit and only the surrounding words and punctuation merge.
    """
    alphabet = [c for c in char_vocab() if c not in SPECIAL_TOKENS]
    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Digits(individual_digits=True)
    trainer = trainers.BpeTrainer(
        vocab_size=len(SPECIAL_TOKENS) + len(alphabet) + num_merges,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    core.train_from_iterator(corpus, trainer)
    return core


def build_char_tokenizer(corpus: Iterable[str] | None = None, num_merges: int = 0) -> PreTrainedTokenizerFast:
    """The character tokenizer as a ``PreTrainedTokenizerFast`` with pad/bos/eos/unk set.

    With a ``corpus`` and ``num_merges > 0`` it also learns that many BPE merges from the corpus (digits
    never merge), which shortens a templated prompt such as "What is 47 - 85?\nAnswer: " from 26 tokens
    to about 9 and so cuts the compute of every forward pass.
    """
    core = _learned_core(corpus, num_merges) if corpus is not None and num_merges > 0 else _char_core()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", core.token_to_id("<bos>"))]
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


def with_chat_template(tokenizer: PreTrainedTokenizerFast, tools: bool = True) -> PreTrainedTokenizerFast:
    """``tokenizer`` with the chat tokens (special) and ``TINY_CHAT_TEMPLATE`` (``dockflow.models.chat_template``);
    for a run with ``tools`` also the tool tokens (not special, as in Qwen2.5) and ``<|end|>`` as its EOS, so a
    model turn ends where the template ends it. Without tools the vocabulary and EOS stay as they were before
    tools existed (the model's init and its SFT do not move). Returns it."""
    tokenizer.add_special_tokens({"additional_special_tokens": list(CHAT_TOKENS)})
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    if tools:
        tokenizer.add_tokens(list(TOOL_TOKENS))
        tokenizer.eos_token = END_OF_TURN
    return tokenizer


_ADDED = re.compile("|".join(re.escape(t) for t in (*CHAT_TOKENS, *TOOL_TOKENS)))


def corpus_pieces(texts: Iterable[str]) -> list[str]:
    """The text between the chat and tool tokens of each of ``texts`` (those are single tokens, never merged)."""
    return [piece for text in texts for piece in _ADDED.split(text) if piece]


def build_task_tokenizer(
    data: DataConfig,
    seed: int,
    merges: int,
    storage: CheckpointConfig | None = None,
    extra_corpus: Sequence[str] = (),
    *,
    tools: bool = False,
) -> PreTrainedTokenizerFast:
    """The tiny model's tokenizer: characters plus ``merges`` merges (``model.tiny.tokenizer_merges``) learned
    from the templated train prompts and answers of ``data`` (its files fetched with ``storage``'s S3 settings)
    and ``extra_corpus`` (a tool run's rendered demonstrations: ``corpus_pieces``); deterministic: the same
    inputs give the same tokenizer. With ``data.chat_template`` also the chat tokens and ``TINY_CHAT_TEMPLATE``, and
    for a run with ``tools`` the tool tokens and ``<|end|>`` as EOS (``with_chat_template``)."""
    from dockflow.data import apply_template, load_task
    from dockflow.data.messages import prompt_text

    task = load_task(data, seed, storage=storage)
    corpus = [(apply_template(data.prompt_template, ex.prompt) if isinstance(ex.prompt, str) else prompt_text(ex.prompt))
              + ex.answer for ex in task.train]
    tokenizer = build_char_tokenizer([*corpus, *corpus_pieces(extra_corpus)], merges)
    if data.chat_template:  # only then: new tokens change the tiny model's vocabulary, hence its init
        with_chat_template(tokenizer, tools)
    return tokenizer
