"""Score a registered version on a run's own evaluation, for the champion gate (``dockflow.tracking.champion``).

    scorer = RegisteredScorer(tracking_uri, cfg.registry, inputs, dtype="float32", device=torch.device("cpu"))
    score, fingerprint = scorer.score(version=3, examples=task.test[:500], split="test")

The version is downloaded (``fetch_model_version``) into a temporary directory on this node, loaded, scored by
``evaluate_policy`` (the code of the run's own evaluation) on the same examples and inputs, and freed. The
fingerprint is that of the evaluation actually run: the same as the run's unless the version's tokenizer
renders the chat template differently.
"""

from __future__ import annotations

import gc
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dockflow.config.sections import RegistryConfig
from dockflow.data import Example
from dockflow.eval.fingerprint import eval_identity
from dockflow.eval.policy import EvalInputs, evaluate_policy
from dockflow.models import load_model_and_tokenizer
from dockflow.tracking.registry import fetch_model_version


@dataclass(frozen=True)
class RegisteredScorer:
    """Where the registered versions are (``tracking_uri``, ``registry``), how the run scores (``inputs``), and how
    a model is loaded here (``dtype``, ``device``)."""

    tracking_uri: str
    registry: RegistryConfig
    inputs: EvalInputs
    dtype: str
    device: torch.device

    def score(self, version: int, examples: Sequence[Example], split: str) -> tuple[float, str]:
        """(``registry.score_metric`` of version ``version`` on ``examples``, the evaluation's fingerprint).
        Raises RegistryError when the version cannot be fetched, ValueError when it does not load as a model or
        the evaluation has no such metric."""
        metric = self.registry.score_metric
        with tempfile.TemporaryDirectory(prefix="dockflow-rescore-") as tmp:
            got = fetch_model_version(self.tracking_uri, self.registry, version, tmp)
            try:
                model, tokenizer = load_model_and_tokenizer(got.local_dir, dtype=self.dtype)
            except Exception as exc:
                why = (str(exc).strip().splitlines() or [""])[0]
                raise ValueError(f"version {version} of '{got.name}' does not load as a model "
                                 f"({type(exc).__name__}: {why})") from exc
        try:
            model.to(self.device).eval()
            ident = eval_identity(examples, self.inputs, tokenizer)
            scores = evaluate_policy(model, tokenizer, examples, self.inputs, split)
        finally:
            del model
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        if metric not in scores:
            raise ValueError(f"the run's evaluation gives {sorted(scores)}, not registry.score_metric {metric}")
        value = float(scores[metric])
        if not math.isfinite(value):
            raise ValueError(f"version {version} scored {value} on {metric}")
        return value, ident.fingerprint
