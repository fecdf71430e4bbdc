"""The HF backend's KV cache: in-place writes into reserved buffers, and a group's prompt prefilled once, with the
same tokens and log-probs as transformers' own ``generate``."""

import pytest
import torch

from dockflow.config import TinyModelConfig
from dockflow.engines import SamplingParams
from dockflow.engines.hf_generation import HFGenerationEngine
from dockflow.engines.kv_cache import ReservedLayer, prefill_shared_prompts, reserved_cache
from dockflow.models import build_char_tokenizer, build_tiny_model

PROMPTS = ["What is 12 + 7?\nAnswer: ", "What is 3 - 45?\nAnswer: ", "What is 1 + 1?\nAnswer: "]


def kv(rows: int, length: int, start: float = 0.0) -> torch.Tensor:
    return torch.arange(rows * 2 * length * 3, dtype=torch.float32).reshape(rows, 2, length, 3) + start


def test_reserved_layer_writes_in_place_and_returns_everything_cached():
    layer = ReservedLayer(capacity=8)
    first, second = kv(2, 3), kv(2, 1, start=100.0)
    layer.update(first, first + 1)
    buffer = layer.keys.data_ptr()
    keys, values = layer.update(second, second + 1)
    assert keys.data_ptr() == buffer  # no new tensor: the step went into the reserved buffer
    assert torch.equal(keys, torch.cat([first, second], dim=-2))
    assert torch.equal(values, torch.cat([first, second], dim=-2) + 1)
    assert layer.get_seq_length() == 4


def test_reserved_layer_grows_past_its_capacity_and_keeps_the_cache():
    layer = ReservedLayer(capacity=2)
    parts = [kv(1, 1, start=10.0 * i) for i in range(5)]
    for p in parts:
        layer.update(p, p)
    assert layer.capacity >= 5 and layer.get_seq_length() == 5
    assert torch.equal(layer.keys, torch.cat(parts, dim=-2))


def test_reserved_layer_selects_rows_with_repeats_and_keeps_writing():
    layer = ReservedLayer(capacity=6)
    first = kv(2, 2)
    layer.update(first, first)
    layer.batch_select_indices(torch.tensor([1, 1, 0]))
    step = kv(3, 1, start=-50.0)
    keys, _ = layer.update(step, step)
    assert torch.equal(keys, torch.cat([first[[1, 1, 0]], step], dim=-2))


def tiny(architecture: str = "qwen2"):
    tok = build_char_tokenizer()
    model = build_tiny_model(TinyModelConfig(architecture=architecture), tok, seed=0).eval()
    return model, tok


def test_shared_prefill_runs_each_distinct_prompt_once():
    model, tok = tiny()
    engine = HFGenerationEngine(model, tok)
    ids, mask = engine._encode_prompts(PROMPTS, None)
    rows_seen = []
    hook = model.register_forward_pre_hook(lambda _, args, kw: rows_seen.append(tuple(kw["input_ids"].shape)),
                                           with_kwargs=True)
    try:
        cache = reserved_cache(model, ids.shape[1] + 4)
        prefill_shared_prompts(model, ids.repeat_interleave(5, 0), mask.repeat_interleave(5, 0), cache)
    finally:
        hook.remove()
    assert rows_seen == [(3, ids.shape[1] - 1)]  # 3 prompts, not 15 rows; the last position is left to generate
    assert cache.get_seq_length() == ids.shape[1] - 1
    assert cache.layers[0].keys.shape[0] == 15


@pytest.mark.parametrize("architecture", ["qwen2", "qwen3_moe"])
def test_sampling_matches_transformers_generate(architecture):
    """Greedy tokens and their log-probs through the shared prefill and reserved cache equal a plain
    ``generate`` of the repeated, left-padded rows."""
    model, tok = tiny(architecture)
    engine = HFGenerationEngine(model, tok)
    ids, mask = engine._encode_prompts(PROMPTS, 30)  # extra left padding
    ids, mask = ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0)
    tokens, logp = engine.sample(ids, mask, 10, SamplingParams(max_new_tokens=10, greedy=True), seed=0)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, output_logits=True,
                             return_dict_in_generate=True)
    new = out.sequences[:, ids.shape[1]:]
    expected = torch.log_softmax(torch.stack(out.logits, dim=1), -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    steps = new.shape[1]
    assert torch.equal(tokens[:, :steps], new)
    torch.testing.assert_close(logp[:, :steps], expected, atol=1e-5, rtol=0)
