"""The policy a run starts RL from, staged where every worker on every node can load it.

In order: a model already staged for this run (a resumed run: the same weights as before); a registered model
(``model.continue_from: latest | champion``); the SFT warm start (cached under ``sft.cache_dir``); ``model.path``
as given (a local directory, or s3://, which workers fetch themselves); a fresh tiny model. What the run makes
itself (SFT, tiny, registry download) is written to ``<checkpoint store>/initial_model`` with a manifest, and the
workers load it from there into their own cache, checking the bytes: so a pipeline's setup pod may vanish, and
the reference model of a resumed run is the same model.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from dockflow.config import Config

INITIAL_MODEL = "initial_model"


def prepare_initial_model(cfg: Config, store: Any, work_dir: Path, tracking_uri: str) -> tuple[str, dict[str, float]]:
    """(URI of the model the workers load, metrics about how it was made, logged at step 0)."""
    from dockflow.storage.objects import stage_model, staged_model_exists

    dest = f"{store.location()}/{INITIAL_MODEL}"
    if staged_model_exists(dest, cfg.checkpoint):
        return dest, {}
    if cfg.model.continue_from != "base":
        from dockflow.tracking.registry import fetch_registered_model

        with tempfile.TemporaryDirectory(prefix="dockflow-registered-") as tmp:
            got = fetch_registered_model(tracking_uri, cfg.registry, cfg.model.continue_from, Path(tmp))
            stage_model(got.local_dir, dest, cfg.checkpoint)
        return dest, {"registry/start_version": float(got.version), "registry/start_score": _number(got.score)}
    if cfg.sft.enabled:
        from dockflow.flow.sft import SFTInputs, check_learned, sft_warm_start

        inputs = SFTInputs(cfg.model, cfg.data, cfg.sft, cfg.checkpoint, cfg.run.seed, cfg.rollout.max_new_tokens,
                           cfg.eval.batch_size, cfg.tools)
        res = sft_warm_start(inputs, work_dir)
        check_learned(res, cfg.sft.min_val_accuracy)
        stage_model(res.model_dir, dest, cfg.checkpoint)
        return dest, {"sft/val_accuracy": res.val_accuracy, "sft/cached": float(res.cached)}
    if cfg.model.path:
        return cfg.model.path, {}
    from dockflow.models.factory import build_tiny_model, save_pretrained_dir
    from dockflow.models.tokenizer import build_task_tokenizer

    tok = build_task_tokenizer(cfg.data, cfg.run.seed, cfg.model.tiny.tokenizer_merges, cfg.checkpoint,
                               tools=cfg.tools.enabled)
    model = build_tiny_model(cfg.model.tiny, tok, seed=cfg.run.seed)
    with tempfile.TemporaryDirectory(prefix="dockflow-tiny-") as tmp:
        stage_model(save_pretrained_dir(model, tok, Path(tmp) / "model"), dest, cfg.checkpoint)
    return dest, {}


def _number(value: Any) -> float:
    return float(value) if value is not None else float("nan")
