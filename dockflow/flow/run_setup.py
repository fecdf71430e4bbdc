"""What both drivers (``dockflow train``: ``flow.trainer``; a pipeline run: ``flow.pipeline_tasks`` and its
``flow.supervisor``) do to start a run: its directory, its config there, and the check of the user's reward
functions.

    check_reward_functions(cfg)             # RewardError naming the path, before any worker starts
    write_run_config(cfg, run_dir_of(cfg))
"""

from __future__ import annotations

from pathlib import Path

import yaml

from dockflow.config import Config


def run_dir_of(cfg: Config) -> Path:
    """The run's local directory: ``run.output_dir/run.name``."""
    return Path(cfg.run.output_dir) / cfg.run.name


def write_run_config(cfg: Config, run_dir: Path) -> None:
    """The run's resolved config as ``config.yaml`` in ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))


def check_reward_functions(cfg: Config) -> None:
    """Import every ``reward.functions`` entry where the run starts, so a path that does not import fails now,
    before any worker starts, with one line (:class:`~dockflow.rewards.functions.RewardError`)."""
    from dockflow.rewards.functions import check_functions

    check_functions(cfg.reward)
