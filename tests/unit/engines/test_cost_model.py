import pytest
import torch

from dockflow.algos.losses import clipped_policy_loss
from dockflow.config import load_config
from dockflow.engines import EngineInputs, SamplingParams, create_engines, first_eos_mask
from dockflow.engines.cost_model import CostModelGeneration, CostModelTraining
from dockflow.models import build_char_tokenizer, build_tiny_model

PROMPTS = ["1+2=", "7-3=", "4+4="]


def cost_engines(**cost):
    overrides = ["engine.backend=cost_model", "engine.cost_model.decode_s_per_step=0",
                 "engine.cost_model.train_s_per_token=0", "engine.cost_model.infer_s_per_token=0"]
    cfg = load_config("configs/grpo_arith.yaml", overrides + [f"engine.cost_model.{k}={v}" for k, v in cost.items()])
    tok = build_char_tokenizer()
    inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed)
    return (*create_engines(inputs, build_tiny_model(cfg.model.tiny, tok, seed=0), tok, cpus=2), tok)


def test_cost_model_rollouts_have_the_real_layout_and_modelled_lengths():
    _, gen, tok = cost_engines(length_mu=1.5, length_sigma=0.5)
    out = gen.generate(PROMPTS, SamplingParams(max_new_tokens=8, n=4), seed=11, prompt_width=10)
    assert out["input_ids"].shape == (12, 18) and torch.equal(out["input_ids"][:, 10:], out["responses"])
    mask = out["response_mask"]
    assert torch.equal(mask, first_eos_mask(out["responses"], tok.eos_token_id))  # one EOS, at the end
    expected = gen.response_lengths(12, 8, seed=11)
    assert torch.equal(out["response_length"], expected) and torch.equal(mask.sum(-1), expected)
    again = gen.generate(PROMPTS, SamplingParams(max_new_tokens=8, n=4), seed=11, prompt_width=10)
    assert torch.equal(again["responses"], out["responses"])  # seeded
    lengths = gen.response_lengths(4000, 10_000, seed=0).double()
    assert abs(lengths.log().mean().item() - 1.5) < 0.05 and lengths.max() > 4 * lengths.median()  # long tail


def test_cost_model_training_runs_the_real_loss_on_zero_log_probs():
    train, gen, _ = cost_engines()
    batch = gen.generate(PROMPTS, SamplingParams(max_new_tokens=6, n=2), seed=0, prompt_width=8)
    assert torch.equal(train.infer(batch), torch.zeros(6, 6))
    batch["old_log_prob"] = torch.zeros(6, 6)
    batch["advantages"] = torch.ones(6, 6)

    def loss_fn(logp, micro, tokens):
        out = clipped_policy_loss(logp, micro["old_log_prob"], micro["advantages"], micro["response_mask"],
                                  clip_eps=0.2, token_denom=tokens)
        return out.loss, {"train/pg_loss": float(out.pg_loss)}

    metrics = train.train_mini_batch(batch, loss_fn, micro_batch_size=2)
    assert metrics["train/pg_loss"] == -1.0 and metrics["grad_norm"] > 0
    assert train.state_dict() == {} and list(train.named_weights()) == []


def test_cost_model_continues_partial_rollouts_from_the_conditional_length_tail():
    from dockflow.engines.token_layout import left_pad_prompts
    from dockflow.rollout.partial import continue_rollouts, empty_rollouts, unfinished

    _, gen, tok = cost_engines(length_mu=2.0, length_sigma=0.8)
    params = SamplingParams(max_new_tokens=32, n=1)
    ids, mask = left_pad_prompts(tok, PROMPTS * 40, None)
    data = empty_rollouts(ids, mask, 32, tok.pad_token_id)
    first = continue_rollouts(gen, data, params, seed=3, budget=6, pad=tok.pad_token_id, eos=tok.eos_token_id)
    open_rows = unfinished(first, tok.eos_token_id)
    assert (first["response_length"] <= 6).all() and open_rows.any() and not open_rows.all()
    assert (first["response_length"][open_rows] == 6).all()  # interrupted at the budget, no EOS yet
    done = continue_rollouts(gen, first, params, seed=4, budget=None, pad=tok.pad_token_id, eos=tok.eos_token_id)
    assert not unfinished(done, tok.eos_token_id).any()
    assert torch.equal(done["responses"][~open_rows], first["responses"][~open_rows])  # finished rows untouched
    assert (done["response_length"][open_rows] > 6).all()  # resumed rows end past what they had
    assert torch.equal(done["response_mask"], first_eos_mask(done["responses"], tok.eos_token_id))
    assert torch.equal(done["responses"][open_rows, :6], first["responses"][open_rows, :6])  # prefix kept


def test_a_cost_model_worker_without_cpus_is_refused_by_name():
    cfg = load_config("configs/grpo_arith.yaml", ["engine.backend=cost_model"])
    with pytest.raises(ValueError, match="engine.cost_model.prefill_s_per_token .* has 0"):
        CostModelGeneration(build_char_tokenizer(), cfg.engine.cost_model, 8, cpus=0)
    with pytest.raises(ValueError, match="engine.cost_model.infer_s_per_token, engine.cost_model.train_s_per_token"):
        CostModelTraining(cfg.engine.cost_model, 0, torch.nn.Linear(1, 1))
    free = cfg.engine.cost_model.model_copy(update={"prefill_s_per_token": 0.0})
    assert CostModelGeneration(build_char_tokenizer(), free, 8, cpus=0).cpus == 1.0  # nothing is divided by it
