"""Whether a model directory's tokenizer fits its model, checked before a run starts its workers:

- every token id the tokenizer can produce must have an embedding row (an id past the last row fails deep inside
  the first forward pass as an index error, or on a GPU as a device-side assert);
- with ``data.chat_template`` the tokenizer must carry a chat template.

    check_tokenizer_fits(Path(cfg.model.path), chat_template=cfg.data.chat_template)   # TokenizerFitError, one line
    tokenizer_fit_problem(tokenizer, model.get_input_embeddings().num_embeddings)      # the text, or None
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class TokenizerFitError(ValueError):
    """The tokenizer of a model directory does not fit its model; the message names the directory and the fix."""


def max_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The largest id the tokenizer can produce: its vocabulary and its added (special) tokens."""
    return max(len(tokenizer) - 1, *tokenizer.get_vocab().values())


def tokenizer_fit_problem(tokenizer: PreTrainedTokenizerBase, embedding_rows: int) -> str | None:
    """What is wrong when the tokenizer's ids exceed the model's ``embedding_rows`` (None: they fit)."""
    top = max_token_id(tokenizer)
    if top < embedding_rows:
        return None
    return (f"its tokenizer produces token ids up to {top} but the model has {embedding_rows} embedding rows "
            "(config.json vocab_size): the tokenizer belongs to another model; use the tokenizer saved with this "
            "model, or resize the model's embeddings to the tokenizer (resize_token_embeddings) and save both")


def embedding_rows(path: Path) -> int | None:
    """The embedding rows ``config.json`` declares (its text model's, for a multimodal one); None if it does not."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    rows = getattr(config.get_text_config(), "vocab_size", None)
    return int(rows) if rows else None


def check_tokenizer_fits(path: Path, chat_template: bool) -> None:
    """Raise TokenizerFitError (one line, naming ``path``) unless the tokenizer in the model directory ``path`` fits
    its model's embeddings and, with ``chat_template`` (``data.chat_template``), carries a chat template."""
    from dockflow.models.factory import load_tokenizer

    tokenizer = load_tokenizer(path)
    rows = embedding_rows(path)
    problem = tokenizer_fit_problem(tokenizer, rows) if rows is not None else None
    if problem is not None:
        raise TokenizerFitError(f"model directory '{path}': {problem}")
    if chat_template and not getattr(tokenizer, "chat_template", None):
        raise TokenizerFitError(
            f"model directory '{path}': data.chat_template is true but its tokenizer has no chat template "
            "(tokenizer_config.json 'chat_template' or chat_template.jinja): use an instruct model's tokenizer, or "
            "set data.chat_template: false (string prompts only)"
        )
