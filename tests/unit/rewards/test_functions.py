"""Reward-function config entries: their shape checked at config load, their import where a run starts (both
drivers, before any worker); output checks; the weighted combination (TRL's nansum)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from dockflow.config import ConfigError, load_config
from dockflow.config.reward import RewardConfig, RewardFunctionConfig
from dockflow.rewards.builtins import math_verify
from dockflow.rewards.functions import RewardError, checked_output, combine, function_path, shipped_modules


def test_builtins_and_paths_resolve() -> None:
    assert function_path(RewardFunctionConfig(name="math_verify")) == "dockflow.rewards.builtins:math_verify"
    assert function_path(RewardFunctionConfig(path="my_rewards:brevity")) == "my_rewards:brevity"
    assert RewardFunctionConfig(path="my_rewards:brevity").label == "brevity"
    assert RewardFunctionConfig(name="short", path="my_rewards:brevity").label == "short"
    assert math_verify(["2+2?", "2+3?"], ["4", "6"], answer=["4", "5"]) == [1.0, 0.0]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("reward.functions=[{path: no_colon}]", "must be module:function"),
        ("reward.functions=[{weight: 1.0}]", "needs 'name' (a built-in) or 'path'"),
        ("reward.functions=[]", "both empty"),
        ("reward.functions=[{name: math_verify}, {path: 'dockflow.rewards.builtins:math_verify'}]", "appear twice"),
    ],
)
def test_bad_reward_config_fails_at_load(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match="reward") as err:
        load_config("configs/grpo_arith.yaml", [override])
    assert message in str(err.value)


UNIMPORTABLE = [
    ("reward.functions=[{path: no_such_module:f}]", "cannot import module 'no_such_module'"),
    ("reward.functions=[{path: dockflow.rewards.builtins:nothing}]", "has no function 'nothing'"),
    ("reward.functions=[{name: unknown}]", "'unknown' is not a built-in"),
]


@pytest.mark.parametrize(("override", "message"), UNIMPORTABLE)
def test_a_reward_path_that_does_not_import_fails_where_the_run_starts(
    override: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The config loads (it imports no user module); ``dockflow train`` fails before the run directory exists, with
    one line and exit 2, and so does the pipeline's setup task, before it joins the Ray cluster."""
    from dockflow.cli import main
    from dockflow.flow import pipeline_tasks

    cfg = load_config("configs/grpo_arith.yaml", [override, f"run.output_dir={tmp_path}"])
    assert cfg.reward.functions
    assert main(["train", "configs/grpo_arith.yaml", override, f"run.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dockflow train: error: ") and message in err and "\n" not in err
    assert not (tmp_path / cfg.run.name).exists()

    def no_cluster(*_args: object) -> None:
        raise AssertionError("setup joined the Ray cluster before checking the reward functions")

    monkeypatch.setattr(pipeline_tasks, "_joined", no_cluster)
    with pytest.raises(RewardError, match=re.escape(message)):
        pipeline_tasks.setup("configs/grpo_arith.yaml", [override, f"run.output_dir={tmp_path}"],
                             pipeline_tasks.RunParams(run_name="r"), "127.0.0.1:1")


def test_user_modules_outside_site_packages_are_shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "shipped_rewards.py").write_text("def f(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    pkg = tmp_path / "rewardpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "scores.py").write_text("def g(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = RewardConfig(functions=[RewardFunctionConfig(path="shipped_rewards:f"), RewardFunctionConfig(path="rewardpkg.scores:g"),
                                  RewardFunctionConfig(name="math_verify")])
    assert shipped_modules(cfg) == [str(tmp_path / "shipped_rewards.py"), str(pkg)]  # not dockflow's own


def test_checked_output_accepts_trl_values_and_names_the_bad_sample() -> None:
    import numpy as np
    import torch

    assert checked_output("f", [1, 0.5, True], 3) == [1.0, 0.5, 1.0]
    out = checked_output("f", [None, float("nan"), np.float32(2.0)], 3)
    assert math.isnan(out[0]) and math.isnan(out[1]) and out[2] == 2.0
    assert checked_output("f", torch.tensor([1.0, 2.0]), 2) == [1.0, 2.0]
    with pytest.raises(RewardError, match="'f' returned float, not a list of 2 numbers"):
        checked_output("f", 1.0, 2)
    with pytest.raises(RewardError, match="'f' returned dict {} at sample 1"):
        checked_output("f", [1.0, {}], 2)


def test_combine_skips_what_does_not_apply() -> None:
    nan = math.nan
    combined = combine([[1.0, nan, nan], [0.5, 0.5, nan]], [1.0, 2.0])
    assert combined[:2] == [2.0, 1.0] and math.isnan(combined[2])  # no function applies: unscorable
