"""The driver's record of a run (``RunRecord``), shared by both drivers (the CLI loop and the KFP pipeline's tasks).

    rec = RunRecord(init_metrics={"sft/val_accuracy": 0.31})
    rec.record_eval(0, {"eval/test_accuracy": 0.25})       # RunTasks._evaluate
    rec.record_iteration(1, metrics, samples=16)            # RunTasks.close (adds train/samples to metrics)
    store.write_part(step, "driver", rec.checkpoint_copy(ahead).to_dict())
    rec = RunRecord.from_dict(store.read_part(step, "driver"))

One field per fact: the held-out evaluations are one list of ``(step, scores)``; the accuracy curve
(``accuracies``) is derived from it. Light (no torch): the supervisor's status reads it.

The "driver" part of a checkpoint is ``to_dict()``: plain dicts, lists and numbers, with ``"record_format": 2``.
``from_dict`` reads that format only: a part of another format (one written before ``record_format`` existed has
none) raises ``RecordFormatError``, one line naming the format and what to do. Keys the format does not have (a
newer DockFlow's) are dropped with a warning: nothing but the driver reads this part, and a field this version
does not know cannot change what it does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

log = logging.getLogger(__name__)

ACCURACY = "eval/test_accuracy"
HISTORY_KEYS = ("reward/mean", "perf/throughput_tps", "timing/iteration_s")  # what the record keeps per iteration
RECORD_FORMAT = 2  # the "driver" part's format; the one before it had no "record_format" key
_FIELDS = ("iteration", "history", "evals", "samples", "restarts", "init_metrics", "mlflow_run_id", "resumed_from",
           "inflight")


class RecordFormatError(ValueError):
    """A checkpoint's driver part in a format this DockFlow does not read."""

Scores = dict[str, float]


@dataclass
class RunRecord:
    """What a checkpoint needs besides the workers' parts, and what ``summary.json`` is made of."""

    iteration: int = 0  # iterations done; also the position in the data (``data/prompt_order.py``)
    history: list[dict[str, float]] = field(default_factory=list)  # per iteration: the HISTORY_KEYS it had
    evals: list[tuple[int, Scores]] = field(default_factory=list)  # held-out scores after step k (0: before RL)
    samples: int = 0  # samples trained
    restarts: int = 0  # restarts from a checkpoint after a worker died (``fault_tolerance``)
    init_metrics: dict[str, float] = field(default_factory=dict)  # how the initial model was made (SFT, registry)
    mlflow_run_id: str | None = None
    resumed_from: int = 0  # the iteration this attempt started at (0: from the beginning)
    # checkpoints only: generate's metrics of the iterations generated ahead of the checkpoint (disaggregated)
    inflight: dict[int, dict[str, float]] = field(default_factory=dict)

    # ---- what the run records ----

    def record_eval(self, step: int, scores: Scores) -> None:
        """The held-out ``scores`` of the policy after ``step`` iterations (they hold ``eval/test_accuracy``)."""
        if ACCURACY not in scores:
            raise KeyError(f"evaluation scores of step {step} have no {ACCURACY!r}: {sorted(scores)}")
        self.evals.append((step, dict(scores)))

    def record_iteration(self, step: int, metrics: dict[str, float], samples: int) -> None:
        """Iteration ``step`` is done, having trained ``samples`` samples: history, counters; adds the running
        total as ``train/samples`` to ``metrics``."""
        self.history.append({k: metrics[k] for k in HISTORY_KEYS if k in metrics})
        self.iteration = step
        self.samples += samples
        metrics["train/samples"] = float(self.samples)

    def checkpoint_copy(self, inflight: dict[int, dict[str, float]]) -> RunRecord:
        """A copy for checkpoint ``self.iteration``, with what was generated ahead of it; later records do not
        change it."""
        return replace(self, history=[dict(h) for h in self.history], evals=[(s, dict(sc)) for s, sc in self.evals],
                       init_metrics=dict(self.init_metrics), inflight={int(j): dict(m) for j, m in inflight.items()})

    def restarted(self, checkpoint: RunRecord | None) -> RunRecord:
        """The record to go on from after a restart: the latest checkpoint's (None: a fresh one that keeps the
        evaluation before RL and how the initial model was made), with this run's MLflow run and one more restart."""
        if checkpoint is None:
            checkpoint = RunRecord(evals=[(s, dict(sc)) for s, sc in self.evals if s == 0],
                                   init_metrics=dict(self.init_metrics))
        return replace(checkpoint, mlflow_run_id=self.mlflow_run_id, restarts=self.restarts + 1)

    # ---- what summaries read ----

    @property
    def evaluated_steps(self) -> set[int]:
        return {s for s, _ in self.evals}

    @property
    def accuracies(self) -> list[tuple[int, float]]:
        """The held-out accuracy curve: ``[(step, eval/test_accuracy)]``."""
        return [(s, sc[ACCURACY]) for s, sc in self.evals]

    @property
    def last_accuracy(self) -> float | None:
        return self.evals[-1][1][ACCURACY] if self.evals else None

    def final_scores(self) -> Scores | None:
        """The scores of the evaluation after the last iteration done (None: there was none)."""
        return dict(self.evals[-1][1]) if self.evals and self.evals[-1][0] == self.iteration else None

    # ---- the checkpoint's "driver" part ----

    def to_dict(self) -> dict[str, Any]:
        """Plain values only (no tuples, no classes): the "driver" part, readable without DockFlow."""
        return {
            "record_format": RECORD_FORMAT, "iteration": self.iteration, "history": [dict(h) for h in self.history],
            "evals": [[s, dict(sc)] for s, sc in self.evals], "samples": self.samples, "restarts": self.restarts,
            "init_metrics": dict(self.init_metrics), "mlflow_run_id": self.mlflow_run_id,
            "resumed_from": self.resumed_from, "inflight": {int(j): dict(m) for j, m in self.inflight.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """A record from a "driver" part of this format (module docstring)."""
        fmt = data.get("record_format")
        if fmt != RECORD_FORMAT:
            written = "none: written before DockFlow's record format 2" if fmt is None else repr(fmt)
            raise RecordFormatError(
                f"the checkpoint's driver record has format {written}; this DockFlow reads format {RECORD_FORMAT} "
                "only: resume it with the DockFlow that wrote it, or start a new run")
        known = {"record_format", *_FIELDS}
        unknown = sorted(set(data) - known)
        if unknown:
            log.warning("the checkpoint's driver record has keys this DockFlow does not know, dropped: %s", unknown)
        evals = [(int(s), dict(sc)) for s, sc in data.get("evals", [])]
        return cls(
            iteration=int(data.get("iteration", 0)), history=[dict(h) for h in data.get("history", [])], evals=evals,
            samples=int(data.get("samples", 0)), restarts=int(data.get("restarts", 0)),
            init_metrics=dict(data.get("init_metrics") or {}), mlflow_run_id=data.get("mlflow_run_id"),
            resumed_from=int(data.get("resumed_from", 0)),
            inflight={int(j): dict(m) for j, m in (data.get("inflight") or {}).items()},
        )
