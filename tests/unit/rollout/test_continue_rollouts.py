"""A partial rollout resumes with the right tokens, log-probs and masks."""

import torch

from dockflow.config import Config
from dockflow.engines import EngineInputs, SamplingParams, create_engines
from dockflow.engines.logprobs import batched_log_probs
from dockflow.engines.token_layout import left_pad_prompts
from dockflow.models import build_char_tokenizer, build_tiny_model
from dockflow.rollout.partial import continue_rollouts, empty_rollouts, unfinished

PROMPTS = ["What is 12 + 7?\nAnswer: ", "What is 3 - 45?\nAnswer: ", "What is 1 + 1?\nAnswer: "]
R = 9


def test_interrupted_rollouts_resume_consistently_under_each_segments_weights():
    cfg = Config()
    tok = build_char_tokenizer()
    inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed)
    train, gen = create_engines(inputs, build_tiny_model(cfg.model.tiny, tok, seed=0), tok)
    other = build_tiny_model(cfg.model.tiny, tok, seed=1)  # the "newer" weights of the second segment
    pad, eos = tok.pad_token_id, tok.eos_token_id
    params = SamplingParams(max_new_tokens=R, temperature=1.3, n=1)
    ids, mask = left_pad_prompts(tok, PROMPTS * 4, None)
    data = empty_rollouts(ids, mask, R, pad)
    first = continue_rollouts(gen, data, params, seed=1, budget=3, pad=pad, eos=eos)
    assert (first["response_length"] <= 3).all()
    assert unfinished(first, eos).any(), "some rows must be interrupted by the budget"
    before = {k: v.clone() for k, v in train.model.named_parameters()}
    gen.load_weights(iter(dict(other.named_parameters()).items()))
    final = continue_rollouts(gen, first, params, seed=2, budget=None, pad=pad, eos=eos)
    assert not unfinished(final, eos).any()
    # Layout: masks are prefixes, the response sits after the prompt, padding after the mask.
    m = final["response_mask"]
    assert (m[:, 1:] <= m[:, :-1]).all() and torch.equal(final["response_length"], m.sum(-1))
    assert torch.equal(final["input_ids"][:, -R:], final["responses"])
    assert torch.equal(final["attention_mask"][:, -R:], m)
    assert (final["responses"][m == 0] == pad).all()
    assert torch.equal(final["responses"][:, :3] * first["response_mask"][:, :3], first["responses"][:, :3])
    # Log-probs: segment one under the first weights, segment two under the second, as a full forward gives.
    seg1 = first["response_mask"].bool()
    seg2 = m.bool() & ~seg1
    under_new = batched_log_probs(gen.model, final, chunk=64, temperature=1.3)
    gen.load_weights(iter(before.items()))
    under_old = batched_log_probs(gen.model, final, chunk=64, temperature=1.3)
    lp = final["rollout_log_prob"]
    assert torch.allclose(lp[seg1], under_old[seg1], atol=1e-4)
    assert torch.allclose(lp[seg2], under_new[seg2], atol=1e-4)
    assert seg2.any() and (lp[~m.bool()] == 0).all()


def test_unchanged_weights_give_the_log_probs_of_one_full_forward():
    cfg = Config()
    tok = build_char_tokenizer()
    inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed)
    train, gen = create_engines(inputs, build_tiny_model(cfg.model.tiny, tok, seed=0), tok)
    pad, eos = tok.pad_token_id, tok.eos_token_id
    params = SamplingParams(max_new_tokens=R, n=1)
    ids, mask = left_pad_prompts(tok, PROMPTS, None)
    data = empty_rollouts(ids, mask, R, pad)
    for seed in range(1, 6):
        data = continue_rollouts(gen, data, params, seed=seed, budget=2, pad=pad, eos=eos)
    assert not unfinished(data, eos).any()
    full = batched_log_probs(train.model, data, chunk=64) * data["response_mask"]
    assert torch.allclose(data["rollout_log_prob"], full, atol=1e-4)
