"""The policy a run starts RL from: the SFT warm start (cached), a given HF directory, or a fresh tiny model."""

from __future__ import annotations

from pathlib import Path

from dockflow.config import Config


def initial_model(cfg: Config, run_dir: Path) -> tuple[str, dict[str, float]]:
    """HF model directory to start from, and metrics about how it was made (logged at step 0)."""
    if cfg.sft.enabled:
        from dockflow.models.sft import sft_warm_start

        res = sft_warm_start(cfg, run_dir)
        return str(res.model_dir), {"sft/val_accuracy": res.val_accuracy, "sft/cached": float(res.cached)}
    if cfg.model.path:
        return cfg.model.path, {}
    from dockflow.models.factory import build_tiny_model, save_pretrained_dir
    from dockflow.models.tokenizer import build_task_tokenizer

    tok = build_task_tokenizer(cfg)
    model = build_tiny_model(cfg.model.tiny, tok, seed=cfg.run.seed)
    return str(save_pretrained_dir(model, tok, run_dir / "initial_model")), {}
