"""Chunked log-probs and entropy (``dockflow.engines.token_head``) equal the whole-logits computation, values and
gradients, within 1e-5 in fp32: the function alone (chunks that do not divide the tokens, temperature, a biased head),
then ``response_log_probs`` on HF decoders (Qwen2 tied and untied, Qwen3, Llama, Qwen3-MoE) against one pass over
the full rows with ``log_softmax`` of the whole logits, and every recipe's loss on top of it."""

import pytest
import torch
from fixtures.engine_batches import rollout_batch, with_old_log_probs
from fixtures.tiny_models import DECODERS, tiny_decoder

from dockflow.algos import recipe_of
from dockflow.config import Config
from dockflow.engines.logprobs import position_ids_from_mask, response_log_probs
from dockflow.engines.token_head import chunked_log_probs, output_head
from dockflow.models import build_char_tokenizer, build_tiny_model

ATOL = 1e-5  # fp32: the chunked and the whole computation sum the same terms in another order


def whole(hidden, weight, bias, targets, temperature):
    logits = (hidden @ weight.t() + (0 if bias is None else bias)) / temperature
    logp_all = torch.log_softmax(logits, -1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp_all.gather(-1, targets[..., None]).squeeze(-1), entropy


@pytest.mark.kernels
@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_equals_whole_logits_with_gradients(chunk, bias):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 11, 16, generator=gen, requires_grad=True)
    weight = torch.randn(500, 16, generator=gen).mul_(0.3).requires_grad_()
    b = torch.randn(500, generator=gen).requires_grad_() if bias else None
    targets = torch.randint(0, 500, (3, 11), generator=gen)
    upstream = torch.randn(3, 11, generator=gen)
    results = []
    for fn in (lambda: chunked_log_probs(hidden, weight, b, targets, temperature=0.7, chunk=chunk),
               lambda: whole(hidden, weight, b, targets, 0.7)):
        logp, entropy = fn()
        params = [hidden, weight] + ([b] if bias else [])
        grads = torch.autograd.grad((logp * upstream).sum(), params)
        results.append((logp.detach(), entropy.detach(), grads))
    (logp, entropy, grads), (ref_logp, ref_entropy, ref_grads) = results
    torch.testing.assert_close(logp, ref_logp, atol=ATOL, rtol=0)
    torch.testing.assert_close(entropy, ref_entropy, atol=ATOL, rtol=0)
    assert not entropy.requires_grad  # a metric
    for got, expected in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


def full_pass(model, batch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropy of the response tokens from one pass over each full row, with the whole logits."""
    ids, mask, width = batch["input_ids"], batch["attention_mask"], batch["responses"].shape[1]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    logp_all = torch.log_softmax(logits[:, -width - 1 : -1].float() / temperature, -1)
    return (logp_all.gather(-1, ids[:, -width:].unsqueeze(-1)).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1))


def moe_decoder() -> torch.nn.Module:
    """The tiny Qwen3-MoE policy (4 experts, 2 per token) with the character tokenizer's vocabulary."""
    cfg = Config(model={"tiny": {"architecture": "qwen3_moe"}}).model.tiny
    return build_tiny_model(cfg, build_char_tokenizer(), seed=0)


MODELS = {**{name: (lambda n=name: tiny_decoder(n)) for name in DECODERS}, "qwen3_moe": moe_decoder}
RECIPES = ["grpo", "dapo", "dr_grpo", "gspo", "ppo", "pf_ppo", "reinforce_pp", "rloo"]


def _grads(model, logp, batch, recipe: str) -> dict[str, torch.Tensor]:
    cfg = Config(algorithm={"name": recipe, "kl_coef": 0.05}, train={"mini_batch_size": 128, "micro_batch_size": 128})
    loss, _ = recipe_of(cfg.algorithm.name).policy_loss(cfg, logp, batch, float(batch["response_mask"].sum()))
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", list(MODELS))
def test_response_log_probs_and_every_recipes_gradients_equal_the_whole_logits(name):
    model = MODELS[name]()
    model.train()
    vocab = output_head(model).weight.shape[0]
    batch = rollout_batch(vocab_size=min(vocab, 40))
    mask = batch["response_mask"]
    ref_logp, ref_entropy = full_pass(model, batch, 0.7)
    batch = with_old_log_probs(batch, ref_logp.detach())
    batch["rollout_log_prob"] = batch["old_log_prob"]
    out = response_log_probs(model, batch["input_ids"], batch["attention_mask"], 5, temperature=0.7, chunk=3)
    torch.testing.assert_close(out.values * mask, ref_logp * mask, atol=ATOL, rtol=0)
    torch.testing.assert_close(out.entropy * mask, ref_entropy * mask, atol=ATOL, rtol=0)
    for recipe in RECIPES:
        expected = _grads(model, full_pass(model, batch, 0.7)[0], batch, recipe)
        got = _grads(model, response_log_probs(model, batch["input_ids"], batch["attention_mask"], 5,
                                               temperature=0.7, chunk=3).values, batch, recipe)
        assert got.keys() == expected.keys(), recipe
        for key, grad in expected.items():
            torch.testing.assert_close(got[key], grad, atol=ATOL, rtol=1e-4, msg=f"{recipe}: {key}")


def test_a_model_with_logit_softcapping_is_refused_in_one_line():
    model = tiny_decoder("qwen2_tied")
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping is not supported"):
        output_head(model)
