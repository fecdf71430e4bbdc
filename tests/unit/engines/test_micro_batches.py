"""Micro-batches by tokens: the cuts (``engines/micro_batches.py``), and one update of the torch engine that leaves the
same weights as sample micro-batches, for the token-mean (GRPO), constant (Dr. GRPO) and sequence (GSPO) losses."""

import pytest
import torch
from fixtures.engine_batches import rollout_batch, with_old_log_probs
from fixtures.tiny_models import tiny_decoder
from fixtures.tolerances import assert_first_step_close, first_step_grads, grad_tolerance

from dockflow.algos import recipe_of
from dockflow.config import Config
from dockflow.engines.micro_batches import micro_batch_bounds
from dockflow.engines.torch_training import TorchTrainingEngine


def test_rows_are_cut_by_samples_or_by_rows_times_the_longest_row():
    assert micro_batch_bounds([3, 9, 9, 40, 2], 2, None) == [(0, 2), (2, 4), (4, 5)]
    assert micro_batch_bounds([3, 9, 9, 40, 2], 2, 30) == [(0, 3), (3, 4), (4, 5)]  # 3 x 9 fits; 40 alone
    assert micro_batch_bounds([50, 50], 2, 30) == [(0, 1), (1, 2)]  # a row over the budget is alone
    assert micro_batch_bounds([5] * 6, 1, 30) == [(0, 6)]  # the budget, not micro_batch_size, decides
    assert micro_batch_bounds([], 2, 30) == []


def test_a_budget_is_a_config_key_and_refused_where_it_cannot_run():
    assert Config(train={"max_tokens_per_micro_batch": 4096}).train.max_tokens_per_micro_batch == 4096
    assert Config(train={"max_tokens_per_micro_batch": 4096, "engine": "megatron"}).train.engine == "megatron"
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch is not supported with algorithm.name=dpo"):
        Config(train={"max_tokens_per_micro_batch": 4096, "mini_batch_size": 64, "micro_batch_size": 64},
               algorithm={"name": "dpo"}, rollout={"group_size": 2})


@pytest.mark.parametrize("recipe", ["grpo", "dr_grpo", "gspo"])
def test_token_budgets_leave_the_weights_of_sample_micro_batches(recipe):
    cfg = Config(algorithm={"name": recipe, "kl_coef": 0.05})
    results = []
    for budget in (None, 12):  # the rows hold 9, 7, 5 and 11 tokens: a budget of 12 cuts 1 row each
        engine = TorchTrainingEngine(tiny_decoder("qwen2_untied"), lr=1e-3, max_tokens_per_micro_batch=budget)
        batch = rollout_batch()
        batch = with_old_log_probs(batch, engine.infer(batch))
        batch["rollout_log_prob"] = batch["old_log_prob"]
        assert len(engine._micro_batches(batch, 2)) == (2 if budget is None else 4)
        metrics = engine.train_mini_batch(
            batch, lambda logp, micro, tokens: recipe_of(cfg.algorithm.name).policy_loss(cfg, logp, micro, tokens), 2)
        moments = {n: engine.optimizer.state[p]["exp_avg"] for n, p in engine.model.named_parameters()}
        results.append((metrics, dict(engine.model.named_parameters()), first_step_grads(moments)))
    (samples, weights, grads), (tokens, budget_weights, budget_grads) = results
    if recipe != "gspo":  # GSPO's train/loss metric is a token-weighted mean of per-micro-batch sequence means
        assert tokens["train/loss"] == pytest.approx(samples["train/loss"], rel=1e-5)
    assert tokens["grad_norm"] == pytest.approx(samples["grad_norm"], rel=1e-5)
    for name, weight in weights.items():
        torch.testing.assert_close(budget_grads[name], grads[name], rtol=0, atol=grad_tolerance(grads))
        assert_first_step_close(budget_weights[name].detach(), weight.detach(), grads[name], grad_tolerance(grads),
                                1e-3, name)
