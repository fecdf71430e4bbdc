"""Generation layout, log-prob consistency and the training step of the CPU engines, on a tiny model."""

import pytest
import torch

from dockflow.config import Config
from dockflow.config.algorithm import CriticSection
from dockflow.engines import (
    EngineInputs,
    SamplingParams,
    create_critic_engine,
    create_engines,
    decode_responses,
    encode_rollouts,
    first_eos_mask,
    response_ids,
)
from dockflow.engines.logprobs import position_ids_from_mask
from dockflow.models import build_char_tokenizer, build_tiny_model, load_critic, save_pretrained_dir
from dockflow.workers.resources import build_plan

PROMPTS = ["What is 12 + 7?\nAnswer: ", "What is 3 - 45?\nAnswer: ", "What is 1 + 1?\nAnswer: "]


@pytest.fixture(scope="module")
def engines():
    cfg = Config()
    tok = build_char_tokenizer()
    model = build_tiny_model(cfg.model.tiny, tok, seed=0)
    inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed)
    return (*create_engines(inputs, model, tok), tok)


def test_first_eos_mask_by_hand():
    tokens = torch.tensor([[5, 2, 9, 9], [5, 6, 7, 8], [2, 9, 2, 9]])
    assert first_eos_mask(tokens, eos_id=2).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


def test_response_ids_and_text_keep_the_masked_in_tokens_without_special_ones():
    tok = build_char_tokenizer()
    rows = [tok.encode(t, add_special_tokens=False) + [tok.eos_token_id] for t in ("-38", "7", "1,234")]
    width = max(len(r) for r in rows) + 2
    responses = torch.tensor([r + [tok.pad_token_id or 0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    assert response_ids(responses, mask) == rows  # EOS included, padding dropped
    assert decode_responses(tok, responses, mask) == ["-38", "7", "1,234"]  # EOS dropped


def test_rollout_layout(engines):
    _, gen, tok = engines
    out = gen.generate(PROMPTS, SamplingParams(max_new_tokens=6, n=4), seed=3, prompt_width=30)
    assert out.batch_size[0] == 12
    assert out["input_ids"].shape == (12, 36) and out["responses"].shape == (12, 6)
    mask = out["response_mask"]
    assert torch.equal(out["input_ids"][:, 30:], out["responses"])
    assert torch.equal(out["attention_mask"][:, 30:], mask)
    assert torch.equal(out["response_length"], mask.sum(-1))
    # masked-out response positions hold padding; masks are a prefix of ones
    assert (out["responses"][mask == 0] == tok.pad_token_id).all()
    assert (mask[:, 1:] <= mask[:, :-1]).all()
    # the group layout: rows 0..3 share prompt 0
    assert torch.equal(out["input_ids"][0, :30], out["input_ids"][3, :30])


def test_the_policy_module_is_the_module_generation_samples_from(engines):
    train, gen, _ = engines
    assert train.policy_module() is gen.model  # colocated on one process: one module, the trained one
    assert dict(train.named_weights()).keys() == dict(gen.model.named_parameters()).keys()


def test_sampling_is_seeded(engines):
    _, gen, _ = engines
    p = SamplingParams(max_new_tokens=6, n=4)
    a, b, c = (gen.generate(PROMPTS, p, seed=s) for s in (1, 1, 2))
    assert torch.equal(a["responses"], b["responses"])
    assert not torch.equal(a["responses"], c["responses"])


def test_log_probs_match_greedy_choice(engines):
    train, gen, _ = engines
    out = gen.generate(PROMPTS, SamplingParams(max_new_tokens=6, greedy=True), seed=0)
    model = train.model
    with torch.no_grad():
        logits = model(
            input_ids=out["input_ids"],
            attention_mask=out["attention_mask"],
            position_ids=position_ids_from_mask(out["attention_mask"]),
        ).logits[:, -7:-1]
    best = logits.log_softmax(-1).max(-1).values
    lp = train.infer(out)
    m = out["response_mask"].bool()
    assert torch.allclose(lp[m], best[m], atol=1e-5)


def test_train_step_changes_parameters_and_accumulates(engines):
    train, gen, _ = engines
    out = gen.generate(PROMPTS, SamplingParams(max_new_tokens=6, n=4), seed=5)
    out["old_log_prob"] = train.infer(out)
    out["advantages"] = torch.randn(12)
    before = {n: p.detach().clone() for n, p in train.model.named_parameters()}

    def loss_fn(logp, micro, tokens):
        from dockflow.algos.losses import clipped_policy_loss

        res = clipped_policy_loss(logp, micro["old_log_prob"], micro["advantages"], micro["response_mask"], token_denom=tokens)
        return res.loss, {"pg": float(res.pg_loss)}

    metrics = train.train_mini_batch(out, loss_fn, micro_batch_size=4)
    assert metrics["grad_norm"] > 0
    changed = [n for n, p in train.model.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)


def test_padding_columns_do_not_change_log_probs(engines):
    train, gen, _ = engines
    p = SamplingParams(max_new_tokens=6, n=2)
    tight = gen.generate(PROMPTS, p, seed=9)
    loose = gen.generate(PROMPTS, p, seed=9, prompt_width=tight["input_ids"].shape[1] - 6 + 7)
    assert torch.equal(tight["responses"], loose["responses"])
    assert torch.allclose(train.infer(tight), train.infer(loose), atol=1e-5)


def test_encoded_rollouts_score_like_generated_ones(engines):
    """Fixed responses (DPO's pairs) take the generation layout, so log-probs mean the same thing."""
    train, gen, tok = engines
    out = gen.generate(PROMPTS[:2], SamplingParams(max_new_tokens=6, greedy=True), seed=0)
    texts = gen.decode(out["responses"], out["response_mask"])
    encoded = encode_rollouts(tok, PROMPTS[:2], texts, 6)
    for key in ("responses", "response_mask", "attention_mask", "input_ids"):
        assert torch.equal(encoded[key], out[key]), key
    assert torch.allclose(train.infer(encoded), train.infer(out))


def test_critic_values_follow_the_response_layout(tmp_path):
    """A critic built from a policy directory: zero head (all values 0 at first), a value per response token,
    and training moves the values towards the returns."""
    cfg = Config(algorithm={"name": "ppo"})  # an algorithm with a critic
    tok = build_char_tokenizer()
    save_pretrained_dir(build_tiny_model(cfg.model.tiny, tok, seed=0), tok, tmp_path / "m")
    inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed)
    critic = create_critic_engine(inputs, build_plan(cfg).section("critic", CriticSection), load_critic(tmp_path / "m"))
    batch = encode_rollouts(tok, PROMPTS, ["19", "-42", "2"], 4)
    values = critic.infer(batch)
    assert values.shape == (3, 4) and torch.count_nonzero(values) == 0
    target = torch.full((3, 4), 0.5)

    def loss_fn(v, micro, tokens):
        loss = ((v - target[: len(v)]) ** 2 * micro["response_mask"]).sum() / tokens
        return loss, {}

    for _ in range(5):
        critic.train_mini_batch(batch, loss_fn, micro_batch_size=3)
    after = critic.infer(batch)[batch["response_mask"].bool()]
    assert (after > 0.05).all()
