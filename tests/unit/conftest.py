"""Fixtures shared by the unit tests of several rooms (models, the SFT warm start, agents, rollouts)."""

from __future__ import annotations

import pytest

from dockflow.config import TinyModelConfig
from dockflow.models import build_char_tokenizer


@pytest.fixture(scope="session")
def micro_cfg() -> TinyModelConfig:
    """A very small tiny-model config, so that model tests stay fast."""
    return TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)


@pytest.fixture(scope="session")
def char_tok():  # noqa: ANN201 - a PreTrainedTokenizerFast
    return build_char_tokenizer()
