from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from dockflow.models.tokenizer import build_char_tokenizer
from tests.unit.agents.chat import qwen_style


@pytest.fixture
def tokenizer() -> PreTrainedTokenizerFast:
    """The tiny model's character tokenizer with Qwen2.5's chat template (tools supported)."""
    return qwen_style(build_char_tokenizer())
