"""The KFP pipeline's driver: a detached Ray actor per run that does what the CLI driver does in-process.

A pipeline task is a short-lived process; this actor is not. It holds the run's config, dock and worker
handles, checkpoint store, MLflow run and record of iterations, and runs the stage a task asks for with the
same functions the CLI loop uses (``dockflow.flow.stages``, ``sync``, ``record``). The tasks only send
``run_stage(stage, iteration)`` and wait, so they start in seconds (no torch, transformers or MLflow to
import). Tasks of different iterations may call it at once under ``max_staleness > 0``: it is a threaded
actor, and its record changes under a lock.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

# Only light imports at module level: a task that looks this actor up by name imports this module (Ray loads
# the class to know its methods), and must not pay for torch, transformers and MLflow. The actor's own
# process imports those in __init__.
STAGES = ("generate", "infer", "update", "reshard", "evaluate")


def _merged(results: dict[str, dict[str, float]]) -> dict[str, float]:
    return {k: v for part in results.values() for k, v in part.items()}


class PipelineDriver:
    """One pipeline run's driver (create it with ``ray.remote(PipelineDriver)``, detached, threaded)."""

    def __init__(self, handles: dict[str, Any], init_metrics: dict[str, float], mlflow_run_id: str) -> None:
        from dockflow.config import Config
        from dockflow.flow import record
        from dockflow.flow.sampler import iteration_sampler
        from dockflow.tracking import Tracker

        self.cfg = cfg = Config.model_validate(handles["config"])
        self.dock, self.workers, self.store = handles["dock"], handles["workers"], handles["store"]
        self.run_dir, self.model_dir = Path(handles["run_dir"]), handles["model_dir"]
        self.init_metrics = init_metrics
        self.tracker = Tracker.attach(cfg.tracking, self.run_dir, mlflow_run_id)
        self.sampler = iteration_sampler(cfg)
        self.state = record.initial_state()
        self.state["mlflow_run_id"] = mlflow_run_id
        self.lock = threading.Lock()
        self.started_at = time.time()
        self.iteration_start: dict[int, float] = {}
        self.generation: dict[int, dict[str, float]] = {}  # generate's metrics, until the iteration ends

    def info(self) -> dict[str, Any]:
        """Plain values only: unpickling them must not import torch in the task process."""
        return {"mlflow_run_id": self.tracker.run_id, "checkpoint_uri": self.store.location(),
                "stage_timeout_s": self.cfg.train.stage_timeout_s, "run_dir": str(self.run_dir)}

    def run_stage(self, stage: str, index: int) -> dict[str, float]:
        """Run ``stage`` of iteration ``index`` (for ``evaluate``: the step it scores) and log its metrics."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; the stages are {list(STAGES)}")
        start = time.perf_counter()
        metrics = getattr(self, f"_{stage}")(index)
        metrics[f"pipeline/{stage}_s"] = time.perf_counter() - start
        self.tracker.log_metrics(metrics, step=index if stage == "evaluate" else index + 1)
        return metrics

    def _wait(self, refs: dict[str, Any], iteration: int) -> dict[str, float]:
        from dockflow.flow.waiting import wait_stages

        return _merged(wait_stages(refs, self.cfg.train.stage_timeout_s, iteration))

    def _generate(self, i: int) -> dict[str, float]:
        from dockflow.flow.sync import generate_and_score

        cfg = self.cfg
        self.dock.reset(window=cfg.dock_window(i))  # the window's last user, iteration i-1-max_staleness, is done
        with self.lock:
            self.iteration_start[i] = time.time()
        metrics = generate_and_score(cfg, self.workers, self.sampler.indices(i), i)
        with self.lock:
            self.generation[i] = dict(metrics)
        return metrics

    def _infer(self, i: int) -> dict[str, float]:
        from dockflow.flow import stages

        return self._wait(stages.infer(self.workers, i, offline=self.cfg.algorithm.name == "dpo"), i)

    def _update(self, i: int) -> dict[str, float]:
        from dockflow.flow import stages

        return self._wait(stages.update(self.workers, i), i)

    def _reshard(self, i: int) -> dict[str, float]:
        """Reshard, close the iteration in the record, checkpoint when due (unless an evaluation follows)."""
        from dockflow.flow import record, stages
        from dockflow.flow.sync import iteration_throughput

        cfg, step = self.cfg, i + 1
        metrics = self._wait(stages.reshard(self.workers, i), i)
        with self.lock:
            seconds = time.time() - self.iteration_start.pop(i)
            whole = {**self.generation.pop(i), "timing/iteration_s": seconds}  # generate logged its own part
            whole["perf/throughput_tps"] = iteration_throughput(whole, record.devices(cfg), seconds)
            record.record_iteration(cfg, self.state, step, whole)
            metrics.update({k: whole[k] for k in ("timing/iteration_s", "perf/throughput_tps", "train/samples")})
        if record.ckpt_due(cfg, step) and not record.eval_due(cfg, step):
            self._checkpoint(step)
        return metrics

    def _evaluate(self, step: int) -> dict[str, float]:
        """Held-out scores after ``step`` iterations (0: before RL); checkpoint when due."""
        from dockflow.flow import record

        scores = record.evaluate(self.cfg, self.workers, step)
        with self.lock:
            record.record_eval(self.state, step, scores)
        if step > 0 and record.ckpt_due(self.cfg, step):
            self._checkpoint(step)
        return scores

    def _checkpoint(self, step: int) -> None:
        from dockflow.flow import record

        with self.lock:
            state = {**self.state, "history": list(self.state["history"]), "evals": list(self.state["evals"])}
        record.save_checkpoint(self.store, self.workers, step, state, self.cfg)

    def finish(self, succeeded: bool) -> dict[str, Any]:
        """End the MLflow run; when every iteration is done, first write the final model and ``summary.json``.
        Returns the summary (empty for a failed run)."""
        from dockflow.flow import record

        summary: dict[str, Any] = {}
        if succeeded and self.state["iteration"] == self.cfg.train.iterations:
            summary = record.finish(self.cfg, self.run_dir, self.workers, self.store, self.tracker, self.state,
                                    self.init_metrics, self.model_dir, time.time() - self.started_at)
        self.tracker.end("FINISHED" if summary else "FAILED")
        return summary

    def shutdown(self) -> None:
        """Kill the run's workers and dock (the caller then kills this actor)."""
        from dockflow.workers import kill_workers

        kill_workers(self.workers)
        self.dock.shutdown()
