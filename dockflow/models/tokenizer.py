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
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from dockflow.config.sections import CheckpointConfig, DataConfig

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
# The tiny tokenizer's own chat template (data.chat_template): each turn is a role token, its text and <|end|>.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
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


def build_task_tokenizer(
    data: DataConfig, seed: int, merges: int, storage: CheckpointConfig | None = None
) -> PreTrainedTokenizerFast:
    """The tiny model's tokenizer: characters plus ``merges`` merges (``model.tiny.tokenizer_merges``) learned
    from the templated train prompts and answers of ``data`` (its files fetched with ``storage``'s S3 settings);
    deterministic: the same inputs give the same tokenizer. With ``data.chat_template`` also the chat tokens
    and ``TINY_CHAT_TEMPLATE``."""
    from dockflow.data import apply_template, load_task
    from dockflow.data.messages import prompt_text

    task = load_task(data, seed, storage=storage)
    corpus = [(apply_template(data.prompt_template, ex.prompt) if isinstance(ex.prompt, str) else prompt_text(ex.prompt))
              + ex.answer for ex in task.train]
    tokenizer = build_char_tokenizer(corpus, merges)
    if data.chat_template:  # only then: new tokens change the tiny model's vocabulary, hence its init
        tokenizer.add_special_tokens({"additional_special_tokens": list(CHAT_TOKENS)})
        tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer
