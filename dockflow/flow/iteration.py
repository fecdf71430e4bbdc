"""What each stage of one iteration sends to the workers: the coroutines the stage loops run (``streaming``).

A reader follows an iteration here top to bottom: ``_generate`` (rollouts into the iteration's dock window; when
the run plan samples in rounds, ``_sampling_rounds`` scores each round at once), ``_infer`` (rewards and
advantages, old and reference log-probs, critic values), ``_update``, ``_reshard`` (the new weights to the
generation layout, or published for the generator workers), ``_evaluate``; ``close`` records the iteration,
``checkpoint`` saves the run. Each coroutine yields ``{name: ObjectRef}`` and gets the results back; none of them
touches sample data.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dockflow.config import Config
from dockflow.data.prompt_order import PromptSampler
from dockflow.dock import TransferDock
from dockflow.flow import record, worker_calls
from dockflow.flow.idle import IdleTracker
from dockflow.flow.metrics import iteration_throughput, merge_results, pop_generated, rollout_summary
from dockflow.flow.run_record import RunRecord
from dockflow.flow.streaming import AWAIT_ONLY, EVAL_SECONDS, StageTask
from dockflow.tracking import Tracker
from dockflow.workers import Workers

if TYPE_CHECKING:
    from dockflow.algos.plan import RunPlan, Sampling
    from dockflow.workers.advantage import RoundAdvantages

ProgressFn = Callable[[int, dict[str, float]], None]


@dataclass(frozen=True)
class RunParts:
    """What one attempt of a run works on (built by ``RunSession`` for each attempt: a restart replaces them)."""

    cfg: Config
    plan: RunPlan  # the run plan, built once by the driver
    workers: Workers
    dock: TransferDock
    sampler: PromptSampler
    store: Any  # the checkpoint store
    tracker: Tracker
    state: RunRecord  # the run's record


class RunTasks:
    """The stage work of one run (``streaming.Tasks``) over its workers, dock, checkpoint store and record."""

    def __init__(self, parts: RunParts, start: int, on_iteration: ProgressFn | None = None) -> None:
        cfg, plan = parts.cfg, parts.plan
        self.cfg, self.plan, self.workers, self.dock, self.sampler = cfg, plan, parts.workers, parts.dock, parts.sampler
        self.store, self.state, self.tracker, self.start = parts.store, parts.state, parts.tracker, start
        self.on_iteration = on_iteration
        self.offline = plan.has("pairs")  # preference pairs, not rollouts
        self.devices = plan.model_cpus()  # ND of Eq. (5)
        self.idle = IdleTracker.for_placement(cfg)
        self.published: dict[int, Any] = {}  # policy version -> its weights in the object store (generators)
        self.generated: dict[int, dict[str, float]] = {}  # generate's metrics until the iteration closes

    def stage(self, stage: str, index: int) -> StageTask:
        return getattr(self, f"_{stage}")(index)

    # ---- the stages ----

    def _generate(self, i: int) -> StageTask:
        """Rollouts of iteration ``i`` into its dock window, with the policy ``i - max_staleness`` at the oldest."""
        cfg = self.cfg
        self.dock.reset(window=self.plan.dock_window(i))  # the window's previous iteration was trained on
        prompt_ids = self.sampler.indices(i)
        sampling = self.plan.sampling
        if sampling.in_rounds:
            metrics, rounds = yield from self._sampling_rounds(i, prompt_ids, sampling)
        else:
            results = yield worker_calls.generate(self.workers, i, prompt_ids, offline=self.offline,
                                            group_size=cfg.rollout.group_size, weights=self._weights_for(i))
            rounds = [pop_generated(results)]
            metrics = merge_results(results)
        metrics.update(rollout_summary(rounds, cfg.global_batch))
        self.generated[i] = metrics
        return metrics

    def _sampling_rounds(self, i: int, prompt_ids: list[int], sampling: Sampling) -> Any:
        """Generate and score rounds of G prompts until ``sampling.quota`` groups have advantages (the plan's
        group selector picks them; the last round fills the batch). Returns the last round's scores with the
        selector's metrics, and every round's rollouts."""
        cfg, g = self.cfg, self.cfg.rollout.prompts_per_iter
        rounds: list[dict[str, float]] = []
        scored: dict[str, float] = {}
        for r in range(sampling.rounds):
            refs = worker_calls.generate(self.workers, i, prompt_ids[r * g: (r + 1) * g], first_index=r * cfg.global_batch,
                                   group_size=cfg.rollout.group_size)
            refs.update(worker_calls.score(self.workers, i, r, r == sampling.rounds - 1))
            results = yield refs
            rounds.append(pop_generated(results))
            advantages: RoundAdvantages = results.pop("advantage")
            scored = {**merge_results(results), **advantages.metrics}
            if advantages.kept >= sampling.quota:
                break
        scored.update(sampling.selector.metrics(advantages.kept, advantages.filled, len(rounds)))
        return scored, rounds

    def _weights_for(self, i: int) -> Any:
        """Generator workers: the published policy that generation ``i`` must use (None: the one they hold)."""
        if not self.workers.generators:
            return None
        return self.published.get(max(i - self.cfg.train.max_staleness, self.start))

    def _infer(self, i: int) -> StageTask:
        """Rewards and advantages (unless generate scored them, round by round), then the model inferences."""
        refs = {} if self.plan.sampling.in_rounds else worker_calls.score(self.workers, i)
        refs.update(worker_calls.infer(self.workers, i, offline=self.offline))
        results = yield refs
        advantages: RoundAdvantages | None = results.pop("advantage", None)
        return {**merge_results(results), **(advantages.metrics if advantages is not None else {})}

    def _update(self, i: int) -> StageTask:
        return merge_results((yield worker_calls.update(self.workers, i)))

    def _reshard(self, i: int) -> StageTask:
        """Colocated: the actor's generation state takes the new weights. Disaggregated: the actor publishes them
        once to the object store, as policy version ``i + 1``; each generation takes the version it is due."""
        if not self.workers.generators:
            return merge_results((yield worker_calls.reshard(self.workers, i)))
        meta, weights = worker_calls.publish(self.workers)
        results = yield {"reshard": meta, f"{AWAIT_ONLY}weights": weights}
        version = int(results["reshard"].pop("policy_version"))
        self.published[version] = weights
        oldest = version - self.cfg.train.max_staleness  # generations after this one never need older weights
        self.published = {v: w for v, w in self.published.items() if v >= oldest}
        return results["reshard"]

    def _evaluate(self, step: int) -> StageTask:
        """Held-out scores of the policy after ``step`` iterations (0: before RL)."""
        results = yield worker_calls.evaluate(self.workers, self.cfg.eval.num_prompts)
        scores = {k: v for k, v in results["evaluate"].items() if k.startswith("eval/")}
        self.state.record_eval(step, scores)
        timed = {**scores, EVAL_SECONDS: results["evaluate"][EVAL_SECONDS]}
        if step == self.start:
            self.tracker.log_metrics_or_defer(timed, step=step)  # later ones are logged with their iteration
        return timed

    # ---- the run's record ----

    def close(self, i: int, parts: dict[str, dict[str, float]], seconds: float) -> None:
        """Iteration ``i`` is done: its metrics (wall seconds since the previous one closed, Eq. 5 throughput, idle
        fractions) go to the record, MLflow (step ``i + 1``) and the progress callback."""
        self.generated.pop(i, None)
        metrics = merge_results(parts)
        metrics["timing/iteration_s"] = seconds
        metrics["perf/throughput_tps"] = iteration_throughput(metrics, self.devices, seconds)
        metrics.update(self.idle.add(metrics, seconds))
        self.state.record_iteration(i + 1, metrics, self.plan.train_batch)
        self.tracker.log_metrics_or_defer(metrics, step=i + 1)  # an MLflow outage must not stop training
        if self.on_iteration is not None:
            self.on_iteration(i + 1, metrics)

    def checkpoint(self, step: int) -> StageTask:
        """Save the workers, the generations already done ahead (their samples and metrics) and the record."""
        started = time.perf_counter()
        refs = {f"checkpoint_{k}": w.save.remote(self.store, step) for k, w in record.stateful(self.workers).items()}
        ahead = [j for j in sorted(self.generated) if j >= step]
        if self.workers.generators:
            refs["inflight"] = self.workers.generators[0].save_inflight.remote(
                self.store, step, ahead, self.workers.rollout_queue)
        yield refs
        saved = self.state.checkpoint_copy({j: self.generated[j] for j in ahead})
        record.commit_checkpoint(self.store, step, saved, self.cfg)
        metrics = {"timing/checkpoint_s": time.perf_counter() - started}
        self.tracker.log_metrics_or_defer(metrics, step=step)  # after its iteration closed: logged on its own
        self.tracker.flush()  # what a resumed run does not repeat is in MLflow once its checkpoint is committed
        return metrics
