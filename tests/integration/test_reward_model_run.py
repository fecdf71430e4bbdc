"""A GRPO run of 2 iterations with a reward model (a tiny one-label classifier built locally) beside the verifier:
the reward-model worker scores every rollout through the dock, and the combined reward holds its weighted score."""

import math

import pytest

from dockflow.flow.trainer import train
from dockflow.models.tiny_reward_model import build_tiny_reward_model
from dockflow.tracking import read_metric_history, resolve_tracking_uri

pytestmark = pytest.mark.slow


def test_two_iterations_with_a_reward_model(tiny_config, tmp_path):
    rm_dir = build_tiny_reward_model(tmp_path / "tiny-rm")
    # No warm start: the reward model is what is tested (the verifier then mostly gives 0).
    cfg = tiny_config("rm", 2, reward__models=f"[{{path: {rm_dir}, weight: 0.5}}]", reward__model_cpus=1,
                      reward__model_batch_size=4, sft__enabled=False, eval__every=0, checkpoint__every=0,
                      dock__backend="centralized", eval__num_prompts=4)
    summary = train(cfg)

    assert summary["iterations"] == 2
    uri = resolve_tracking_uri(None, cfg.run.output_dir)

    def history(key: str) -> list[float]:
        steps = read_metric_history(uri, summary["mlflow_run_id"], key)
        assert [s for s, _ in steps] == [1, 2], key
        return [v for _, v in steps]

    assert all(t > 0 for t in history("timing/reward_model_s"))
    rm, verifier, combined = history("rewards/tiny-rm/mean"), history("rewards/math_verify/mean"), history("reward/mean")
    assert all(math.isfinite(v) and v != 0.0 for v in rm)
    assert rm[0] != rm[1]  # new rollouts, new scores
    for step in range(2):  # GRPO does not shape rewards: the combined mean is the weighted sum of the means
        assert combined[step] == pytest.approx(verifier[step] + 0.5 * rm[step], abs=1e-5)
