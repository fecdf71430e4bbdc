"""One RL iteration, phase by phase: each stage's gate (when it may start) and its work (what it asks the workers).

A reader follows an iteration here top to bottom. ``s`` is ``train.max_staleness``; "sent" is enough where two
stages share a worker, because Ray runs one caller's calls to an actor in the order they were sent and every call
comes from the loops' one thread (so each worker sees the same order in every run: a run is reproducible bit for
bit). Across workers the dock orders the data: a get blocks until its columns are ready, so scoring and inference
stream behind generation.

    phase      gate (``waits_for``)                                  work
    generate   reshard(i-1-s) done (the policy is at version         rollouts of G prompts x N into the
               >= i - s), the checkpoint of step i - s written,      iteration's dock window (in rounds, each
               evaluate(i - s) sent                                  scored at once, when the plan selects groups)
    infer      generate(i) sent (done, in rounds), reshard(i-1)      rewards and advantages (unless generate
               and evaluate(i) sent, checkpoint i written            scored them); old and reference log-probs,
                                                                     critic values
    update     infer(i) sent                                         the policy (and critic) update
    reshard    update(i) sent                                        the new weights to the generation layout,
                                                                     or published for the generator workers
    evaluate   reshard(k-1) sent (step 0, before RL: at the start)   held-out scores of the policy after k steps

Each stage's work is a generator that yields ``{name: ObjectRef}`` to the stage loops
(``dockflow.flow.stage_loops``), gets the results back and returns its metrics; none of them touches sample data,
only iteration numbers and prompt indices. ``close`` records an iteration, ``checkpoint`` saves the run. A stage
with several ranks (train.dp x tp x pp actor ranks, critic ranks) calls each: ``stage`` is rank 0's result,
``stage/k`` rank k's; rank 0 reports the stage's metrics, the others only their own ``memory/rank<k>/...``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dockflow.config import Config
from dockflow.data.prompt_order import PromptSampler
from dockflow.dock import TransferDock
from dockflow.flow import run_checkpoint
from dockflow.flow.idle import IdleTracker
from dockflow.flow.metrics import iteration_throughput, merge_results, pop_generated, rollout_summary
from dockflow.flow.run_record import RunRecord
from dockflow.flow.stage_loops import AWAIT_ONLY, EVAL_SECONDS, Progress, StageTask
from dockflow.tracking import Tracker
from dockflow.workers import Workers

if TYPE_CHECKING:
    from dockflow.algos.plan import RunPlan, Sampling
    from dockflow.workers.advantage import RoundAdvantages

ProgressFn = Callable[[int, dict[str, float]], None]
Refs = dict[str, Any]


def waits_for(stage: str, i: int, p: Progress) -> list[str]:
    """The gate of ``stage`` of iteration ``i`` (``evaluate``: of step ``i``): what it still waits for."""
    s, sent, done, start = p.schedule.max_staleness, p.sent, p.done, p.schedule.start
    if stage == "generate":
        version = max(i - 1 - s, start - 1)  # before the start: the policy the run starts from
        need = [(version in done["reshard"], f"reshard {version} done"),
                (not p.checkpoint_due(i - s) or i - s in done["checkpoint"], f"checkpoint {i - s}"),
                (not p.eval_due(i - s) or i - s in sent["evaluate"], f"evaluate {i - s} sent")]
    elif stage == "infer":
        generated = done if p.schedule.in_rounds else sent
        need = [(i in generated["generate"], f"generate {i}"), (i - 1 in sent["reshard"], f"reshard {i - 1} sent"),
                (not p.eval_due(i) or i in sent["evaluate"], f"evaluate {i} sent"),
                (not p.checkpoint_due(i) or i in done["checkpoint"], f"checkpoint {i}")]
    elif stage == "update":
        need = [(i in sent["infer"], f"infer {i} sent")]
    elif stage == "reshard":
        need = [(i in sent["update"], f"update {i} sent")]
    elif stage == "evaluate":
        need = [(i == start or i - 1 in sent["reshard"], f"reshard {i - 1} sent")]
    else:
        raise ValueError(f"unknown stage {stage!r}")
    return [what for ok, what in need if not ok]


def shares(n: int, parts: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of each of ``parts`` contiguous, near-equal shares of ``n`` items (earlier ones larger)."""
    size, extra = divmod(n, parts)
    bounds = [0]
    for k in range(parts):
        bounds.append(bounds[-1] + size + (k < extra))
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def on_ranks(ranks: list[Any], stage: str, method: str, *args: Any) -> Refs:
    """Call ``method`` on every rank (collective with several): ``stage`` for rank 0, ``stage/k`` for rank k."""
    return {stage if k == 0 else f"{stage}/{k}": getattr(r, method).remote(*args) for k, r in enumerate(ranks)}


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
    """The stage work of one run (``stage_loops.Tasks``) over its workers, dock, checkpoint store and record."""

    waits_for = staticmethod(waits_for)

    def __init__(self, parts: RunParts, start: int, on_iteration: ProgressFn | None = None) -> None:
        cfg, plan = parts.cfg, parts.plan
        self.cfg, self.plan, self.workers, self.dock, self.sampler = cfg, plan, parts.workers, parts.dock, parts.sampler
        self.store, self.state, self.tracker, self.start = parts.store, parts.state, parts.tracker, start
        self.on_iteration = on_iteration
        self.devices = plan.model_cpus()  # ND of Eq. (5)
        self.idle = IdleTracker.for_placement(cfg)
        self.published: dict[int, Any] = {}  # policy version -> its weights in the object store (generators)
        self.generated: dict[int, dict[str, float]] = {}  # generate's metrics until the iteration closes

    def stage(self, stage: str, index: int) -> StageTask:
        return getattr(self, f"_{stage}")(index)

    # ---- 1. generate ----

    def _generate(self, i: int) -> StageTask:
        """Rollouts of iteration ``i`` into its dock window, with the policy ``i - max_staleness`` at the oldest."""
        cfg = self.cfg
        self.dock.reset(window=self.plan.dock_window(i))  # the window's previous iteration was trained on
        prompt_ids = self.sampler.indices(i)
        sampling = self.plan.sampling
        if sampling.in_rounds:
            metrics, rounds = yield from self._sampling_rounds(i, prompt_ids, sampling)
        else:
            results = yield self._rollouts(i, prompt_ids, 0)
            rounds = [pop_generated(results)]
            metrics = merge_results(results)
        metrics.update(rollout_summary(rounds, cfg.global_batch))
        self.generated[i] = metrics
        return metrics

    def _rollouts(self, i: int, prompt_ids: list[int], first_index: int) -> Refs:
        """N responses per prompt into the dock from index ``first_index`` on (offline algorithms: the preference
        pairs ``prompt_ids``). Colocated, the actor ranks generate, each a fixed contiguous share of the prompts
        into the matching slice of the window. Disaggregated, one generator generates them all, or several draw
        chunks from the run's rollout queue as they go (a faster one takes more); each first takes the published
        policy that generation ``i`` is due when it is newer than its own."""
        workers, n = self.workers, self.cfg.rollout.group_size
        if self.plan.has("pairs"):
            return {"generate": workers.pairs.put_pairs.remote(i, prompt_ids)}
        if not workers.generators:
            ranks = workers.actors
            if len(ranks) == 1:
                return {"generate": ranks[0].generate.remote(i, prompt_ids, first_index)}
            return {f"generate/{k}": ranks[k].generate.remote(i, prompt_ids[lo:hi], first_index + lo * n)
                    for k, (lo, hi) in enumerate(shares(len(prompt_ids), len(ranks)))}
        weights = self.published.get(max(i - self.cfg.train.max_staleness, self.start))
        if len(workers.generators) == 1:
            return {"generate/0": workers.generators[0].generate.remote(i, prompt_ids, first_index, weights=weights)}
        opened = workers.rollout_queue.open.remote(i, prompt_ids)
        return {f"generate/{k}": g.generate.remote(i, prompt_ids, first_index, workers.rollout_queue, k, opened,
                                                   weights=weights)
                for k, g in enumerate(workers.generators)}

    def _sampling_rounds(self, i: int, prompt_ids: list[int], sampling: Sampling) -> Any:
        """Generate and score rounds of G prompts until ``sampling.quota`` groups have advantages (the plan's
        group selector picks them; the last round fills the batch). Returns the last round's scores with the
        selector's metrics, and every round's rollouts."""
        g, round_samples = self.cfg.rollout.prompts_per_iter, self.cfg.global_batch
        rounds: list[dict[str, float]] = []
        scored: dict[str, float] = {}
        for r in range(sampling.rounds):
            refs = self._rollouts(i, prompt_ids[r * g: (r + 1) * g], r * round_samples)
            refs.update(self._scoring(i, r, r == sampling.rounds - 1))
            results = yield refs
            rounds.append(pop_generated(results))
            advantages: RoundAdvantages = results.pop("advantage")
            scored = {**merge_results(results), **advantages.metrics}
            if advantages.kept >= sampling.quota:
                break
        scored.update(sampling.selector.metrics(advantages.kept, advantages.filled, len(rounds)))
        return scored, rounds

    # ---- 2. infer ----

    def _infer(self, i: int) -> StageTask:
        """Rewards and advantages (unless generate scored them, round by round), then the model inferences: old
        log-probs (actor ranks), reference log-probs, critic values (critic ranks), for the workers the run has."""
        workers = self.workers
        refs = {} if self.plan.sampling.in_rounds else self._scoring(i)
        if not self.plan.has("pairs"):
            refs.update(on_ranks(workers.actors, "old_log_prob", "compute_old_log_prob", i))
        if workers.reference is not None:
            refs["ref_log_prob"] = workers.reference.compute_ref_log_prob.remote(i)
        elif self.plan.reference_in_actor:  # LoRA: the actor ranks' base model, the adapter off
            refs.update(on_ranks(workers.actors, "ref_log_prob", "compute_ref_log_prob", i))
        refs.update(on_ranks(workers.critics, "values", "compute_values", i))
        results = yield refs
        advantages: RoundAdvantages | None = results.pop("advantage", None)
        return {**merge_results(results), **(advantages.metrics if advantages is not None else {})}

    def _scoring(self, i: int, round_index: int = 0, last_round: bool = True) -> Refs:
        """Rewards and advantages of one generation round, streamed off the dock (none for offline algorithms);
        with reward models, their scores too (the reward state waits in the dock for them)."""
        reward, reward_model = self.workers.reward, self.workers.reward_model
        if reward is None:
            return {}
        refs = {"reward": reward.compute_rewards.remote(i),
                "advantage": reward.compute_advantages.remote(i, round_index, last_round)}
        if reward_model is not None:
            refs["reward_model"] = reward_model.score.remote(i)
        return refs

    # ---- 3. update ----

    def _update(self, i: int) -> StageTask:
        """The policy update on the iteration's samples, and the critic's."""
        refs = on_ranks(self.workers.actors, "update", "update", i)
        refs.update(on_ranks(self.workers.critics, "critic_update", "update", i))
        return merge_results((yield refs))

    # ---- 4. reshard ----

    def _reshard(self, i: int) -> StageTask:
        """Colocated: the actor's generation state takes the new weights (allgather-swap with train.dp >= 2).
        Disaggregated: the actor publishes them once to the object store, as policy version ``i + 1``; each
        generation takes the version it is due (``_rollouts``)."""
        if not self.workers.generators:
            return merge_results((yield on_ranks(self.workers.actors, "reshard", "reshard")))
        meta, weights = self.workers.actor.publish_weights.options(num_returns=2).remote()
        results = yield {"reshard": meta, f"{AWAIT_ONLY}weights": weights}  # the weights go worker to worker
        version = int(results["reshard"].pop("policy_version"))
        self.published[version] = weights
        oldest = version - self.cfg.train.max_staleness  # generations after this one never need older weights
        self.published = {v: w for v, w in self.published.items() if v >= oldest}
        return results["reshard"]

    # ---- 5. evaluate ----

    def _evaluate(self, step: int) -> StageTask:
        """Held-out scores of the policy after ``step`` iterations (0: before RL), on actor rank 0's unsharded
        generation copy; offline algorithms add the margin on the pair source's held-out pairs (passed worker to
        worker, not through the driver)."""
        pairs = self.workers.pairs.eval_pairs.remote() if self.workers.pairs is not None else None
        results = yield {"evaluate": self.workers.actor.evaluate.remote("test", self.cfg.eval.num_prompts, pairs)}
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
        refs = {f"checkpoint_{k}": w.save.remote(self.store, step) for k, w in run_checkpoint.stateful(self.workers).items()}
        ahead = [j for j in sorted(self.generated) if j >= step]
        if self.workers.generators:
            refs["inflight"] = self.workers.generators[0].save_inflight.remote(
                self.store, step, ahead, self.workers.rollout_queue)
        yield refs
        saved = self.state.checkpoint_copy({j: self.generated[j] for j in ahead})
        run_checkpoint.commit_checkpoint(self.store, step, saved, self.cfg)
        metrics = {"timing/checkpoint_s": time.perf_counter() - started}
        self.tracker.log_metrics_or_defer(metrics, step=step)  # after its iteration closed: logged on its own
        self.tracker.flush()  # what a resumed run does not repeat is in MLflow once its checkpoint is committed
        return metrics
