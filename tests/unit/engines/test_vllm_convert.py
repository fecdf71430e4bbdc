"""The vLLM engine's pure parts (``engines/vllm_convert.py``): sampling-parameter mapping, vLLM outputs -> the
rollout layout (checked against the HF engine's own layout), and the weight names vLLM's Qwen2 / Qwen3-MoE
loaders take (checked against what transformers writes into a checkpoint)."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from dockflow.config import Config, TinyModelConfig
from dockflow.engines import HFGenerationEngine, SamplingParams
from dockflow.engines.token_layout import rollout_batch
from dockflow.engines.vllm_convert import (
    Completion,
    VLLMOutputError,
    checkpoint_weights,
    completions_in_order,
    expand_requests,
    prompt_token_lists,
    request_seeds,
    response_rows,
    rows_as_tensors,
    sampled_logprobs,
    sampling_kwargs,
    strip_wrappers,
    weight_buckets,
)
from dockflow.models import build_char_tokenizer, build_tiny_model

EOS, PAD = 2, 0


def test_sampling_kwargs_sampled_and_greedy():
    sampled = sampling_kwargs(SamplingParams(max_new_tokens=9, temperature=0.7, top_p=0.9, n=4), 9, EOS, 11, 4)
    assert sampled == {
        "n": 4, "temperature": 0.7, "top_p": 0.9, "max_tokens": 9, "min_tokens": 0, "ignore_eos": True,
        "stop_token_ids": [EOS], "logprobs": 0, "seed": 11, "detokenize": False,
    }
    greedy = sampling_kwargs(SamplingParams(temperature=0.7, top_p=0.5, greedy=True), 5, EOS, 3, 1)
    assert (greedy["temperature"], greedy["top_p"], greedy["n"], greedy["max_tokens"]) == (0.0, 1.0, 1, 5)
    assert "top_k" not in greedy  # left at the installed vLLM's "off" default (0 in 0.33, -1 in older releases)


def test_expand_requests_splits_greedy_groups():
    assert expand_requests(2, 3, greedy=False) == [(0, 3), (1, 3)]
    assert expand_requests(2, 3, greedy=True) == [(0, 1), (0, 1), (0, 1), (1, 1), (1, 1), (1, 1)]


def test_request_seeds_give_every_sample_its_own_seed():
    requests = expand_requests(5, 4, greedy=False)
    seeds = request_seeds(7, requests)
    samples = [s + k for s, (_, n) in zip(seeds, requests, strict=True) for k in range(n)]  # vLLM: k-th sample gets seed + k
    assert len(set(samples)) == 20
    assert seeds == request_seeds(7, requests)
    assert seeds != request_seeds(8, requests)
    assert all(0 <= s < 2**32 for s in samples)


def test_prompt_token_lists_drop_left_padding():
    ids = [[0, 0, 5, 6], [7, 8, 9, 1]]
    mask = [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert prompt_token_lists(ids, mask) == [[5, 6], [7, 8, 9, 1]]


def _logprob_entries(tokens, values):
    """vLLM's CompletionOutput.logprobs: per position {token id: Logprob(logprob, rank, decoded_token)}."""
    return [{t: SimpleNamespace(logprob=v, rank=1, decoded_token=None)} for t, v in zip(tokens, values, strict=True)]


def test_sampled_logprobs_reads_logprob_objects_and_floats():
    assert sampled_logprobs([4, 5], _logprob_entries([4, 5], [-0.5, -1.5])) == [-0.5, -1.5]
    top2 = [{4: -0.1, 9: -3.0}, {9: -0.2, 5: -2.0}]  # logprobs=k > 0: the sampled token is among the entries
    assert sampled_logprobs([4, 5], top2) == [-0.1, -2.0]
    with pytest.raises(VLLMOutputError, match="no log-probs"):
        sampled_logprobs([4], None)
    with pytest.raises(VLLMOutputError, match="2 log-prob positions for 1 tokens"):
        sampled_logprobs([4], top2)
    with pytest.raises(VLLMOutputError, match="sampled token 7"):
        sampled_logprobs([7], [{4: -0.1}])


def test_completions_in_order_follow_requests_then_sample_index():
    def out(index, tokens):
        return SimpleNamespace(index=index, token_ids=tokens, logprobs=_logprob_entries(tokens, [-1.0] * len(tokens)),
                               finish_reason="length")

    requests = [SimpleNamespace(outputs=[out(1, [11]), out(0, [10])]), SimpleNamespace(outputs=[out(0, [20])])]
    assert [c.token_ids for c in completions_in_order(requests)] == [[10], [11], [20]]


def test_response_rows_cut_at_first_eos_and_pad():
    rows = [
        Completion([5, 6, EOS], [-1.0, -2.0, -3.0], "stop"),
        Completion([5, 6, 7, 8], [-1.0, -2.0, -3.0, -4.0], "length"),
        Completion([EOS], [-0.5], "stop"),
    ]
    tokens, logp, lengths = response_rows(rows, 4, EOS, PAD)
    assert tokens == [[5, 6, EOS, PAD], [5, 6, 7, 8], [EOS, PAD, PAD, PAD]]
    assert logp == [[-1.0, -2.0, -3.0, 0.0], [-1.0, -2.0, -3.0, -4.0], [-0.5, 0.0, 0.0, 0.0]]
    assert lengths == [3, 4, 1]
    t, lp, mask = rows_as_tensors(tokens, logp, lengths, 4)
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert t.dtype == torch.long and lp.dtype == torch.float32 and torch.equal(lp, lp * mask)


@pytest.mark.parametrize(
    ("completion", "match"),
    [
        (Completion([5], [-1.0], "abort"), "reason 'abort'"),
        (Completion([5, 6], [-1.0, -2.0], "length"), "2 of 4 tokens and no EOS"),  # cut by max_model_len
        (Completion([5, 6], [-1.0], "stop"), "1 log-probs for 2 tokens"),
    ],
)
def test_response_rows_refuse_what_the_layout_cannot_hold(completion, match):
    with pytest.raises(VLLMOutputError, match=match):
        response_rows([completion], 4, EOS, PAD)


def test_response_rows_hold_each_row_to_its_own_cap():
    """Partial rollouts ask each row for its own room: a row that took all of its cap is complete, not cut."""
    rows = [Completion([5, 6], [-1.0, -2.0], "length"), Completion([5, EOS], [-1.0, -2.0], "stop")]
    tokens, _, lengths = response_rows(rows, 4, EOS, PAD, caps=[2, 4])
    assert tokens == [[5, 6, PAD, PAD], [5, EOS, PAD, PAD]] and lengths == [2, 2]
    with pytest.raises(VLLMOutputError, match="1 of 2 tokens and no EOS"):
        response_rows([Completion([5], [-1.0], "length")], 4, EOS, PAD, caps=[2])


def test_converted_rows_equal_the_hf_engines_layout():
    """vLLM rows (tokens up to EOS, their log-probs, finish reason) through the converter give exactly the tensors
    the HF engine lays out for the same samples."""
    tok = build_char_tokenizer()
    model = build_tiny_model(Config().model.tiny, tok, seed=0)
    eos_bias = torch.zeros(len(tok))
    eos_bias[tok.eos_token_id] = 3.0  # an untrained model rarely says EOS: make some rows end early
    model.lm_head.register_forward_hook(lambda module, args, out: out + eos_bias)
    hf = HFGenerationEngine(model, tok)
    prompts = ["What is 12 + 7?\nAnswer: ", "What is 3 - 45?\nAnswer: "]
    params = SamplingParams(max_new_tokens=6, n=3)
    ref = hf.generate(prompts, params, seed=5, prompt_width=30)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    completions = []
    for row, mask, logp in zip(ref["responses"], ref["response_mask"], ref["rollout_log_prob"], strict=True):
        n = int(mask.sum())
        tokens = row[:n].tolist()
        completions.append(Completion(tokens, logp[:n].tolist(), "stop" if tokens[-1] == eos else "length"))
    rows, logp, lengths = response_rows(completions, 6, eos, pad)
    tokens, logp_t, mask = rows_as_tensors(rows, logp, lengths, 6)
    prompt_ids = ref["input_ids"][:, :30]
    got = rollout_batch(prompt_ids, ref["attention_mask"][:, :30], tokens, mask)
    for key in ("input_ids", "attention_mask", "responses", "response_mask", "prompt_length", "response_length"):
        assert torch.equal(got[key], ref[key]), key
    assert torch.equal(logp_t, ref["rollout_log_prob"])
    assert (ref["response_length"] < 6).any() and (ref["response_length"] == 6).any()  # both endings occur


def test_strip_wrappers():
    assert strip_wrappers("_orig_mod.model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight") == \
        "model.layers.0.mlp.up_proj.weight"
    assert strip_wrappers("module.lm_head.weight") == "lm_head.weight"
    assert strip_wrappers("model.norm.weight") == "model.norm.weight"


def _saved_checkpoint(model, tmp_path: Path) -> dict[str, torch.Tensor]:
    model.save_pretrained(tmp_path)
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(tmp_path.glob("*.safetensors")):
        tensors.update(load_file(f))
    return tensors


@pytest.mark.parametrize("architecture", ["qwen2", "qwen3_moe"])
@pytest.mark.parametrize("tied", [True, False])
def test_checkpoint_weights_are_what_transformers_saves(architecture, tied, tmp_path):
    """The names and tensors fed to vLLM are those of the model's Hugging Face checkpoint, which vLLM's Qwen2 /
    Qwen3-MoE loaders read (per-expert names for Qwen3-MoE, no lm_head when the embeddings are tied)."""
    tok = build_char_tokenizer()
    cfg = TinyModelConfig(architecture=architecture, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                          intermediate_size=64, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    model = build_tiny_model(cfg, tok, seed=0)
    if not tied:
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() + 1.0)
    saved = _saved_checkpoint(model, tmp_path)
    mapped = dict(checkpoint_weights(model.named_parameters(), tie_word_embeddings=tied))
    assert sorted(mapped) == sorted(saved)
    for name, tensor in mapped.items():
        assert torch.equal(tensor, saved[name]), name
    if architecture == "qwen3_moe":
        assert "model.layers.1.mlp.experts.3.up_proj.weight" in mapped
        assert mapped["model.layers.0.mlp.experts.1.gate_proj.weight"].shape == (16, 32)
        assert mapped["model.layers.0.mlp.experts.1.down_proj.weight"].shape == (32, 16)
    assert ("lm_head.weight" in mapped) == (not tied)


def test_checkpoint_weights_drop_a_tied_head_that_is_listed():
    head = torch.zeros(4, 2)
    named = [("model.embed_tokens.weight", head), ("lm_head.weight", head)]
    assert [n for n, _ in checkpoint_weights(named, tie_word_embeddings=True)] == ["model.embed_tokens.weight"]


def test_weight_buckets_bound_bytes_and_keep_order():
    named = [(f"w{k}", torch.zeros(n, dtype=torch.float32)) for k, n in enumerate([10, 10, 30, 5, 100, 1])]
    buckets = list(weight_buckets(named, bucket_bytes=80))  # 20 floats
    assert [[n for n, _ in b] for b in buckets] == [["w0", "w1"], ["w2"], ["w3"], ["w4"], ["w5"]]
    assert [n for b in buckets for n, _ in b] == [n for n, _ in named]
    assert list(weight_buckets([], 80)) == []
