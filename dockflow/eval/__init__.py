"""Benchmark evaluation: greedy accuracy, pass@k and avg@k of a policy on held-out or user math sets.

    from dockflow.eval import EvalInputs, evaluate_policy, pass_at_k, sampled_scores
    inputs = EvalInputs(cfg.eval, cfg.data, cfg.rollout.max_new_tokens, cfg.run.seed, cfg.tools)
    evaluate_policy(model, tok, task.test[:500], inputs)   # {"eval/test_accuracy": .., "eval/test_pass_at_8": ..}

``dockflow.eval.command`` (the ``dockflow eval`` command) is not imported here: it pulls in the checkpoint store
and MLflow (``dockflow.storage``, ``dockflow.tracking``), which the workers that score a policy do not need.
"""

from dockflow.eval.pass_at_k import avg_at_k, pass_at_k, sample_scores
from dockflow.eval.policy import EvalInputs, evaluate_policy, metric_key, score_examples
from dockflow.eval.sampling import sampled_scores

__all__ = [
    "EvalInputs",
    "avg_at_k",
    "evaluate_policy",
    "metric_key",
    "pass_at_k",
    "sample_scores",
    "sampled_scores",
    "score_examples",
]
