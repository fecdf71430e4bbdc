"""The generation engine's own log-probs of the sampled tokens equal a full forward under the same weights."""

import torch

from dockflow.config import Config
from dockflow.engines import EngineInputs, SamplingParams, create_engines
from dockflow.engines.logprobs import batched_log_probs
from dockflow.models import build_char_tokenizer, build_tiny_model

PROMPTS = ["What is 12 + 7?\nAnswer: ", "What is 3 - 45?\nAnswer: "]


def test_rollout_log_prob_matches_a_forward_pass_at_the_sampling_temperature():
    cfg = Config()
    tok = build_char_tokenizer()
    inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed)
    train, gen = create_engines(inputs, build_tiny_model(cfg.model.tiny, tok, seed=0), tok)
    for temperature in (1.0, 1.7):
        out = gen.generate(PROMPTS, SamplingParams(max_new_tokens=7, temperature=temperature, n=3), seed=5)
        assert out["rollout_log_prob"].shape == out["responses"].shape
        assert (out["rollout_log_prob"][out["response_mask"] == 0] == 0).all()
        full = batched_log_probs(train.model, out, chunk=64, temperature=temperature) * out["response_mask"]
        assert torch.allclose(out["rollout_log_prob"], full, atol=1e-4), (out["rollout_log_prob"] - full).abs().max()
        assert (full[out["response_mask"].bool()] < 0).all()
