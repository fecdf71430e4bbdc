"""Response log-probs and critic values with each distinct prompt computed once: the same numbers and gradients as
one pass over every full row, and the positions the load metrics count."""

import torch

from dockflow.config import Config
from dockflow.engines import SamplingParams, encode_rollouts
from dockflow.engines.hf_generation import HFGenerationEngine
from dockflow.engines.logprobs import (
    forward_load,
    position_ids_from_mask,
    response_log_probs,
    response_values,
)
from dockflow.models import build_char_tokenizer, build_tiny_model, load_critic, save_pretrained_dir

PROMPTS = ["What is 12 + 7?\nAnswer: ", "What is 3 - 45?\nAnswer: ", "What is 1 + 1?\nAnswer: "]


def group_rollouts(n: int = 4, prompt_width: int = 28):
    """Sampled rollouts of PROMPTS, ``n`` per prompt, in the dock's layout (left-padded prompts), and the model."""
    tok = build_char_tokenizer()
    model = build_tiny_model(Config().model.tiny, tok, seed=0)
    out = HFGenerationEngine(model, tok).generate(PROMPTS, SamplingParams(max_new_tokens=6, n=n), 1, prompt_width)
    return model, out


def full_pass(model, batch, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of the response tokens from one forward pass over each full row (no sharing, no trimming)."""
    ids, mask, width = batch["input_ids"], batch["attention_mask"], batch["responses"].shape[1]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    logits = logits[:, -width - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids[:, -width:].unsqueeze(-1)).squeeze(-1)


def grads(model, logp: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    (logp * mask).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_log_probs_and_gradients_equal_one_pass_over_full_rows():
    model, batch = group_rollouts()
    model.train()
    mask = batch["response_mask"]
    shared = response_log_probs(model, batch["input_ids"], batch["attention_mask"], 6, temperature=0.7).values
    full = full_pass(model, batch, temperature=0.7)
    torch.testing.assert_close(shared * mask, full * mask, atol=1e-5, rtol=0)
    expected = grads(model, full, mask)
    got = grads(model, response_log_probs(model, batch["input_ids"], batch["attention_mask"], 6, 0.7).values, mask)
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_each_distinct_prompt_goes_through_the_model_once():
    model, batch = group_rollouts(n=5)
    shapes = []
    hook = model.register_forward_pre_hook(lambda _, args, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                           with_kwargs=True)
    try:
        with torch.no_grad():
            response_log_probs(model, batch["input_ids"], batch["attention_mask"], 6)
    finally:
        hook.remove()
    prompt_width = int(batch["attention_mask"][:, :28].any(0).sum())  # the all-padding columns are cut
    assert shapes[0] == (3, prompt_width)  # 3 prompts, not 15 rows
    assert shapes[1][0] == 15


def test_forward_load_counts_distinct_prompts_once():
    model, batch = group_rollouts(n=5)
    mask = batch["attention_mask"]
    prompt_width = int(mask[:, :28].any(0).sum())
    longest = int(batch["response_mask"].sum(-1).max())
    positions, real = forward_load(batch, pack=False)
    assert positions == 3 * prompt_width + 15 * longest  # the layout chosen for groups of 5: shared prompts
    prompt_tokens = sum(len(tok) for tok in (build_char_tokenizer()(p)["input_ids"] for p in PROMPTS))
    assert real == prompt_tokens + float(batch["response_mask"].sum())


def test_critic_values_equal_one_pass_over_full_rows(tmp_path):
    tok = build_char_tokenizer()
    save_pretrained_dir(build_tiny_model(Config().model.tiny, tok, seed=0), tok, tmp_path / "m")
    critic = load_critic(tmp_path / "m")
    torch.nn.init.normal_(critic.score.weight)  # its head starts at zero; any values will do here
    batch = encode_rollouts(tok, [PROMPTS[0]] * 2 + [PROMPTS[1]], ["19", "1", "-42"], 4)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        shared = response_values(critic, ids, mask, 4).values
        full = critic(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    rmask = batch["response_mask"]
    torch.testing.assert_close(shared * rmask, full[:, -5:-1, 0] * rmask, atol=1e-5, rtol=0)
