"""sampled_scores and evaluate_policy on a micro model: k samples per prompt, grouped, seeded, RNG untouched."""

from __future__ import annotations

import pytest
import torch

from dockflow.config import load_config
from dockflow.data import Example, PromptFormat, apply_template
from dockflow.engines import SamplingParams
from dockflow.eval import EvalInputs, evaluate_policy, sample_scores, sampled_scores
from dockflow.eval.greedy import generate_responses
from dockflow.models import build_tiny_model
from dockflow.rewards import verify

TEMPLATE = "{prompt}\nAnswer: "
FMT = PromptFormat(TEMPLATE)
K, MAX_NEW, SEED = 4, 5, 7


@pytest.fixture(scope="module")
def model(micro_cfg, char_tok):  # noqa: ANN201 - a Qwen2ForCausalLM
    return build_tiny_model(micro_cfg, char_tok, seed=0)


def _params(k: int) -> dict:
    """sampled_scores' settings for the micro model: k samples at temperature 1, 3 prompts per batch."""
    return {"k": k, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": MAX_NEW, "fmt": FMT, "batch_size": 3, "seed": SEED}


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


def test_sampled_scores_group_k_samples_per_prompt_and_are_seeded(model, char_tok) -> None:
    prompts = [f"What is {a} + {a}?" for a in range(4)]
    params = SamplingParams(max_new_tokens=MAX_NEW, temperature=1.0, top_p=1.0, n=K)
    responses = generate_responses(model, char_tok, [apply_template(TEMPLATE, p) for p in prompts], params, 3, SEED)
    assert len(responses) == len(prompts) * K
    # Each prompt's reference answer is one of ITS OWN samples, so pass@k is 1 only if samples stay grouped.
    examples = []
    for i, p in enumerate(prompts):
        own = next((r for r in responses[i * K : (i + 1) * K] if _first_line(r)), None)
        examples.append(Example(p, _first_line(own) if own else "no such answer"))
    correct = [[verify(r, ex.answer) for r in responses[i * K : (i + 1) * K]] for i, ex in enumerate(examples)]
    assert sum(any(row) for row in correct) >= 3, "the untrained model should write text for most prompts"

    rng_before = torch.get_rng_state()
    got = sampled_scores(model, char_tok, examples, **_params(K))
    assert torch.equal(torch.get_rng_state(), rng_before), "evaluation must not move the caller's RNG"
    assert got == sample_scores(correct, K)
    assert got[f"pass@{K}"] >= got[f"avg@{K}"] > 0
    assert sampled_scores(model, char_tok, examples, **_params(K)) == got
    assert sampled_scores(model, char_tok, [], **_params(K)) == {"pass@4": 0.0, "avg@4": 0.0}
    with pytest.raises(ValueError, match="k=0"):
        sampled_scores(model, char_tok, examples, **_params(0))


def test_evaluate_policy_names_mlflow_metrics(model, char_tok) -> None:
    examples = [Example("What is 1 + 1?", "2"), Example("What is 2 + 2?", "4")]
    small = ["rollout.max_new_tokens=3", "eval.batch_size=2"]
    def inputs(*extra: str) -> EvalInputs:
        cfg = load_config(None, [*small, *extra])
        return EvalInputs(cfg.eval, cfg.data, cfg.rollout.max_new_tokens, cfg.run.seed)

    greedy_only = evaluate_policy(model, char_tok, examples, inputs())
    assert list(greedy_only) == ["eval/test_accuracy"]
    scores = evaluate_policy(model, char_tok, examples, inputs("eval.pass_k=2"), split="val")
    assert list(scores) == ["eval/val_accuracy", "eval/val_pass_at_2", "eval/val_avg_at_2"]
    assert all(0.0 <= v <= 1.0 for v in scores.values())
