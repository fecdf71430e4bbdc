"""``dockflow eval``: score a model directory on a config's held-out split or on a user JSONL/Parquet file.

Greedy accuracy always; pass@k and avg@k when ``eval.pass_k`` (``--k``) is above 1. With ``--mlflow-run`` the
scores are also logged to that run (``tracking.uri`` of the config) as ``eval/<name>_accuracy``,
``eval/<name>_pass_at_<k>``, ``eval/<name>_avg_at_<k>``, where ``<name>`` is the split or the file's stem, at
the run's ``train.iterations`` step (the final model's iteration), with the evaluation's fingerprint
(``dockflow.eval.fingerprint``) as the run's tag ``dockflow.eval.<name>_fingerprint``; the printed result has it too.

    scoring = EvalInputs(cfg.eval, cfg.data, cfg.rollout.max_new_tokens, cfg.run.seed, cfg.tools)
    setup = EvalRun(scoring, cfg.checkpoint, cfg.run, cfg.tracking, cfg.model.dtype)
    result = run_eval(setup, "configs/grpo_arith.yaml", data="data/examples/math_mini.jsonl")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dockflow.config.sections import CheckpointConfig, RunConfig, TrackingConfig
from dockflow.data import check_prompts, load_task
from dockflow.data.loaders import Columns, load_examples
from dockflow.eval.fingerprint import eval_identity
from dockflow.eval.policy import EvalInputs, metric_key, score_examples
from dockflow.models import load_model_and_tokenizer
from dockflow.storage import run_store
from dockflow.storage.objects import fetch_model, is_s3_uri
from dockflow.tracking import Tracker


@dataclass(frozen=True)
class EvalRun:
    """What ``dockflow eval`` reads of a run's config: how to score (``scoring``), where the run keeps its files
    (``checkpoint`` and ``run``: its final model, the S3 settings of its inputs), the model's dtype and the
    MLflow store (``tracking``)."""

    scoring: EvalInputs
    checkpoint: CheckpointConfig
    run: RunConfig
    tracking: TrackingConfig
    dtype: str


def _model_dir(setup: EvalRun, config_path: str, model: str | None) -> Path:
    given = model is not None
    if model is None:  # the run's final model, staged in its checkpoint store (a directory or s3://)
        model = f"{run_store(setup.checkpoint, setup.run).location()}/final_model"
    if is_s3_uri(model):  # s3://bucket/prefix: fetched (checked) into this node's cache
        return fetch_model(str(model), setup.checkpoint)
    model_dir = Path(model)
    if not model_dir.is_dir():
        hint = "pass --model DIR" if given else f"train first (dockflow train {config_path}) or pass --model DIR"
        raise FileNotFoundError(f"model directory '{model_dir}' does not exist: {hint}")
    return model_dir


def log_scores(tracker: Tracker, name: str, scores: dict[str, float]) -> dict[str, float]:
    """Log ``scores`` of eval set ``name`` to the tracker's run at its ``train.iterations`` step (else 0)."""
    try:
        step = int(tracker.params().get("train.iterations", 0))
    except ValueError:
        step = 0
    metrics = {metric_key(name, k): v for k, v in scores.items()}
    tracker.log_metrics(metrics, step=step)
    return metrics


def run_eval(
    setup: EvalRun,
    config_path: str,
    model: str | None = None,
    split: str = "test",
    limit: int | None = None,
    data: str | None = None,
    mlflow_run: str | None = None,
) -> dict[str, Any]:
    """Score the model; returns what the CLI prints (model, data or split, prompts, scores, logged metrics)."""
    # Attach first, so that a wrong run id fails before the model work, not after it.
    tracker = Tracker.attach(setup.tracking, setup.run.output_dir, mlflow_run) if mlflow_run else None
    model_dir = _model_dir(setup, config_path, model)
    task_data, storage = setup.scoring.data, setup.checkpoint
    examples = (
        check_prompts(task_data, data, load_examples(data, storage, Columns(task_data.prompt_key, task_data.answer_key)))
        if data
        else getattr(load_task(task_data, setup.scoring.seed, storage=storage), split)
    )
    examples = examples[: limit or None]
    lm, tok = load_model_and_tokenizer(model_dir, dtype=setup.dtype)
    scores = score_examples(lm, tok, examples, setup.scoring)
    name = Path(data.rstrip("/")).stem if data else split
    fingerprint = eval_identity(examples, setup.scoring, tok).fingerprint
    out: dict[str, Any] = {"model": str(model_dir), **({"data": data} if data else {"split": split})}
    out |= {"prompts": len(examples), "fingerprint": fingerprint, **scores}
    ev = setup.scoring.eval
    if ev.pass_k > 1:
        out |= {"k": ev.pass_k, "temperature": ev.temperature, "top_p": ev.top_p}
    if tracker is not None:
        out["mlflow"] = {"run_id": tracker.run_id, "metrics": log_scores(tracker, name, scores)}
        tracker.set_tags({f"dockflow.eval.{name}_fingerprint": fingerprint})  # which evaluation these metrics are
    return out

