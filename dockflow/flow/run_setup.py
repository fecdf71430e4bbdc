"""What both drivers (``dockflow train``: ``flow.trainer``; a pipeline run: ``flow.pipeline_tasks`` and its
``flow.supervisor``) do to start a run: its directory, its config there, and the check of the user's reward
functions.

    check_reward_functions(cfg)             # RewardError naming the path or the missing column, before any worker
    check_model_path(cfg)                   # ModelFilesError / TokenizerFitError naming model.path, before Ray starts
    check_lora_fits(cfg)                    # LoraError: model.lora's targets and rank against that model
    write_run_config(cfg, run_dir_of(cfg))
"""

from __future__ import annotations

from pathlib import Path

import yaml

from dockflow.config import Config
from dockflow.redact import redact_config


def run_dir_of(cfg: Config) -> Path:
    """The run's local directory: ``run.output_dir/run.name``."""
    return Path(cfg.run.output_dir) / cfg.run.name


def write_run_config(cfg: Config, run_dir: Path) -> None:
    """The run's resolved config as ``config.yaml`` in ``run_dir`` (logged to MLflow: its secrets hidden)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(redact_config(cfg.model_dump()), sort_keys=False))


def check_reward_functions(cfg: Config) -> None:
    """Import every ``reward.functions`` entry where the run starts, so a path that does not import, or a
    function that requires a column the train rows lack (``data.answer_key``, the file's columns), fails now,
    before any worker starts, with one line (:class:`~dockflow.rewards.functions.RewardError`); the same for the
    ``tools:`` paths (:class:`~dockflow.agents.ToolError`). A file's rows are loaded here only when a function
    requires more than the reference answer."""
    from dockflow.agents import import_tool
    from dockflow.data import task_columns
    from dockflow.rewards.functions import check_columns, check_functions

    required = check_functions(cfg.reward, cfg.tools.has_environment)
    if any(required.values()):
        data = cfg.data
        check_columns(required, task_columns(data, cfg.run.seed, storage=cfg.checkpoint), data.answer_key)
    for path in cfg.tools.paths:
        import_tool(path)


def check_model_path(cfg: Config) -> None:
    """A local ``model.path`` that a new run starts from must be a loadable model directory whose tokenizer fits
    it (ids within the embedding rows; a chat template with ``data.chat_template``): checked where the run starts,
    so it fails with one line (:class:`~dockflow.models.factory.ModelFilesError`,
    :class:`~dockflow.models.tokenizer_fit.TokenizerFitError`) before Ray and the workers, not in every worker's
    constructor. An ``s3://`` model is checked where it is fetched (the vocabulary where a worker loads it)."""
    path = cfg.model.path
    if not path or path.startswith("s3://") or cfg.model.continue_from != "base":
        return
    from dockflow.models.factory import ModelFilesError, check_model_dir
    from dockflow.models.tokenizer_fit import TokenizerFitError, check_tokenizer_fits

    try:
        check_model_dir(Path(path))
        check_tokenizer_fits(Path(path), chat_template=cfg.data.chat_template)
    except ModelFilesError as exc:
        raise ModelFilesError(f"model.path: {exc}") from None
    except TokenizerFitError as exc:
        raise TokenizerFitError(f"model.path: {exc}") from None


def check_lora_fits(cfg: Config) -> None:
    """``model.lora``'s target modules and rank against the model a new run starts from (its architecture alone,
    built on the meta device): :class:`~dockflow.engines.lora.LoraError`, one line, before Ray and SFT. An
    ``s3://`` or registered model is checked where the actor builds its engines."""
    lora, path = cfg.model.lora, cfg.model.path
    if lora is None or cfg.model.continue_from != "base" or (path or "").startswith("s3://"):
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dockflow.engines.lora import check_targets
    from dockflow.models import build_char_tokenizer
    from dockflow.models.factory import tiny_model_config

    config = AutoConfig.from_pretrained(path) if path else tiny_model_config(cfg.model.tiny, build_char_tokenizer())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    check_targets(model, lora)
