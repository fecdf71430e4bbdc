"""The actor (policy) worker: a Ray actor that generates, computes old log-probs, updates and evaluates.

It holds the policy in a training engine and a generation engine (colocated: generation shares the
policy's tensors, so resharding is a no-op on one process). With ``train.dp`` = W >= 2 there are W actor
workers, ranks of one process group: each generates for its share of the prompts on a plain copy of the
policy, takes an equal share of every batch for old log-probs and the FSDP2 update, and the states cycle
update -> reshard (allgather-swap) -> generate -> swap back -> update (``engines/fsdp_training.py``). With
``train.engine: megatron`` there are dp x tp x pp actor workers, megatron ranks of dp replicas of one model: each
generates for its share of the prompts on its full HF copy; for log-probs and the update the first rank of each
replica's model group reads the replica's share of every batch from the dock and passes it to its TP / PP peers
(``model_parallel``). Multi-rank metrics are rank 0's (summed over the replicas' readers where each counts its own
share), plus each rank's memory ledger. Every method reads its inputs from the
transfer dock and writes its outputs back; the driver passes only iteration numbers and prompt indices.
The loss is the algorithm's (its recipe's ``policy_loss``: the clipped surrogate of the policy-gradient
algorithms, GSPO's sequence-level one, DPO's on the pairs the pair source put into the dock).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, TypeVar

import torch
from tensordict import TensorDict

from dockflow.algos.plan import RunPlan
from dockflow.config import Config
from dockflow.config.engine import sync_tolerance
from dockflow.data import PromptFormat, load_task
from dockflow.data.length_policy import check_prompt_lengths
from dockflow.data.task_identity import task_identity
from dockflow.dock import DockBatch, DockRequest, TransferDock
from dockflow.engines import EngineInputs, create_engines
from dockflow.engines.devices import process_group_backend
from dockflow.engines.lora import adapter_tensors, is_lora, merged_weights, save_lora_model
from dockflow.engines.routing import RoutingStats, check_recording
from dockflow.engines.sync_check import SYNC_CHECK, LogProbDrift, SyncChecker
from dockflow.eval import EvalInputs, evaluate_policy
from dockflow.eval.fingerprint import EvalIdentity, eval_identity
from dockflow.models import load_model_and_tokenizer
from dockflow.reshard.ledger import storage_bytes
from dockflow.rollout.multi_turn import ToolTable, generate_tools_into_dock
from dockflow.rollout.plain import generate_into_dock
from dockflow.rollout.prompts import PromptTable
from dockflow.rollout.queue import staleness_bound
from dockflow.storage.objects import fetch_model
from dockflow.workers.consume import WaitClock, consume, fill_column
from dockflow.workers.dp_group import join_dp_group
from dockflow.workers.model_parallel import ModelReplica, from_readers, model_group, shared_stream
from dockflow.workers.peak_memory import peak_memory_metrics
from dockflow.workers.runtime import ModelWorker
from dockflow.workers.staleness import StalenessCounter
from dockflow.workers.update_loop import length_sorted, train_epochs

T = TypeVar("T")


def sync_checker(cfg: Config) -> SyncChecker:
    """The weight-sync check of ``engine.sync_check`` for this run's model dtype (never on the cost model, which
    holds no weights to compare)."""
    sc = cfg.engine.sync_check
    every = 0 if cfg.engine.backend == "cost_model" else sc.every
    return SyncChecker(every, sc.sequences, sc.length, sync_tolerance(cfg.engine, cfg.model.dtype), cfg.run.seed)


class ActorWorker(ModelWorker):
    """Policy states: generate -> (reshard) -> old log-probs -> update; plus greedy evaluation."""

    part = "actor"

    def __init__(self, cfg: Config, plan: RunPlan, model_dir: str, dock: TransferDock, rank: int = 0, dp_key: str = ""):
        """``rank`` of ``train.actor_ranks`` actor ranks; with several (with megatron, even one) the ranks first
        join one process group, found under ``dp_key`` (see ``dp_group``), and train with FSDP2 (dp >= 2) or
        megatron (dp x tp x pp)."""
        super().__init__(cfg, dock, cfg.train.actor_ranks)
        self.plan = plan  # the run plan, built once by the driver
        self.rank, self.dp = rank, cfg.train.dp
        world = cfg.train.actor_ranks
        if world > 1 or cfg.train.engine == "megatron":  # megatron's parallel state needs a group, even of one rank
            join_dp_group(rank, world, dp_key, cfg.ray.init_timeout_s, cfg.train.stage_timeout_s,
                          backend=process_group_backend(cfg.engine.device))  # gloo / nccl / hccl
        # dp replicas (FSDP2's ranks: tp = pp = 1) of a tp x pp model; a megatron model group splits one replica:
        # its first rank reads the replica's share of the dock and passes every batch on (``model_parallel``)
        self.replica = ModelReplica(rank, cfg.train.tp, cfg.train.pp, cfg.train.dp)
        self.model_group = model_group(self.replica)
        model, self.tokenizer = load_model_and_tokenizer(fetch_model(model_dir, cfg.checkpoint), dtype=cfg.model.dtype)
        inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed, cfg.model.lora)
        self.train_engine, self.gen_engine = create_engines(inputs, model, self.tokenizer,
                                                            cpus=plan.role("actor").cpus)  # this rank's share
        self.engine = self.train_engine  # the checkpointed one
        check_recording("routed_experts" in plan.role("actor").writes, self.gen_engine)
        self.task = load_task(cfg.data, cfg.run.seed, storage=cfg.checkpoint)
        self.prompts = PromptTable(
            PromptFormat.of(cfg.data).render_all([ex.prompt for ex in self.task.train], self.tokenizer), self.gen_engine
        )
        context = getattr(model.config, "max_position_embeddings", None)
        check_prompt_lengths(self.prompts.templated, self.tokenizer, cfg.data, cfg.rollout.max_new_tokens, context)
        self.tool_table = ToolTable(cfg, self.task.train, self.tokenizer, context) if cfg.tools.enabled else None
        self.columns = plan.role("actor").reads  # its states' dock columns
        self.policy_version = 0
        self.recipe = plan.recipe  # the algorithm: its loss, how its rows are batched
        self.sync_checker = sync_checker(cfg)

    def ready(self) -> bool:
        return True

    @property
    def reads_dock(self) -> bool:
        """Whether this rank reads the dock for its replica (every FSDP2 rank; a megatron model group's first)."""
        return self.replica.reads_dock

    @property
    def policy(self):
        """The unsharded policy module that generation, evaluation and saving read (dp >= 2: the generation copy)."""
        return self.train_engine.policy_module()

    def generate(self, iteration: int, prompt_ids: list[int], first_index: int = 0) -> dict[str, float]:
        """Sample N responses for each prompt and stream them into the dock, group by group, from dock index
        ``first_index`` on (later rounds of dynamic sampling write after the earlier ones)."""
        if self.tool_table is not None:
            return generate_tools_into_dock(
                self.cfg, self.gen_engine, self.dock, self.tool_table, iteration=iteration, prompt_ids=prompt_ids,
                first_index=first_index, policy_version=self.policy_version,
                window_start=self.plan.dock_window(iteration)[0],
            )
        return generate_into_dock(
            self.cfg, self.gen_engine, self.dock, self.prompts, iteration=iteration, prompt_ids=prompt_ids,
            first_index=first_index, policy_version=self.policy_version, window_start=self.plan.dock_window(iteration)[0],
        )

    def compute_old_log_prob(self, iteration: int) -> dict[str, float]:
        """Log-probs of the behaviour policy (the weights that generated), for the ratio. With
        ``train.old_log_prob: rollout`` generation already put them into the dock: nothing to do."""
        if self.cfg.train.old_log_prob == "rollout":
            return {}
        cols = self.columns["actor_infer"]
        waited = WaitClock()
        drift = LogProbDrift()  # rollout engine vs trainer, on the samples generated with the weights held now
        self.train_engine.routing_stats()  # counted from here: this pass over the rollout

        def old_log_prob(batch: DockBatch) -> torch.Tensor:
            logp = self.train_engine.infer(batch.data)
            current = torch.as_tensor(batch.meta["policy_version"]) == self.policy_version if self.reads_dock else None
            if current is not None and bool(current.any()):
                drift.add(batch.data["rollout_log_prob"][current], logp[current], batch.data["response_mask"][current])
            return logp

        request = DockRequest("actor_infer", self.cfg.train.infer_batch_size, cols, window=self.plan.dock_window(iteration))
        batches = consume(self.dock, request, self.cfg.global_batch // self.dp, clock=waited) if self.reads_dock else None
        seconds = fill_column(self.dock, self._shared(batches), "old_log_prob", old_log_prob, writes=self.reads_dock)
        drift = LogProbDrift.merged(from_readers(drift, self.replica))  # every replica's share
        out = {"timing/old_log_prob_s": seconds, "timing/old_log_prob_wait_s": waited.seconds}
        return self._report({**out, **drift.metrics(), **self._routing_metrics()})

    def _routing_metrics(self) -> dict[str, float]:
        """``moe/routing_mismatch`` of the passes since the last count, over every replica's share (collective with
        several replicas); none for a dense policy or without recorded routing."""
        stats = self.train_engine.routing_stats() if self.reads_dock else None
        return RoutingStats.merged(from_readers(stats, self.replica)).metrics()

    def compute_ref_log_prob(self, iteration: int) -> dict[str, float]:
        """With ``model.lora`` (``RunPlan.reference_in_actor``): the reference policy's log-probs, from this rank's
        own module with the adapter off (the base model), into ``ref_log_prob``; each rank its share."""
        bs = self.cfg.train.infer_batch_size
        request = DockRequest("ref_infer", bs, self.columns["ref_infer"], window=self.plan.dock_window(iteration))
        batches = consume(self.dock, request, self.cfg.global_batch // self.dp) if self.reads_dock else None
        seconds = fill_column(self.dock, self._shared(batches), "ref_log_prob",
                              lambda batch: self.train_engine.infer_reference(batch.data), writes=self.reads_dock)
        return self._report({"timing/ref_log_prob_s": seconds})

    def update(self, iteration: int) -> dict[str, float]:
        """Train on the iteration's samples with the algorithm's loss: mini-batches as they become ready, then
        further epochs. Samples more than ``train.max_staleness`` policy versions old are masked out of the loss
        and counted."""
        start = time.perf_counter()
        tc = self.cfg.train
        paired = self.recipe.paired_rows  # (chosen, rejected) rows: keep them together and in order
        waited = WaitClock()
        balance = tc.seqlen_balance and not paired
        # each DP rank takes an equal share of every mini-batch (FSDP's collectives need equal step counts),
        # balanced by response length across the ranks when seqlen_balance is on
        request = DockRequest("actor_update", tc.mini_batch_size // self.dp, tuple(self.columns["actor_update"]),
                              whole_groups=paired, window=self.plan.dock_window(iteration),
                              dp_share=(self.replica.index, self.dp) if balance and self.dp > 1 else None)
        staleness = StalenessCounter(self.policy_version, staleness_bound(self.cfg))
        measured = "actor_infer" not in self.columns  # old_log_prob: rollout: the update's is the first pass
        self.train_engine.routing_stats()
        mini_batches = None
        if self.reads_dock:
            batches = consume(self.dock, request, self.plan.train_batch // self.dp, clock=waited)
            mini_batches = (staleness.admit(b.data, b.meta["policy_version"]) for b in batches)
            if balance:  # with a token budget every mini-batch is sorted: the budget cuts it, not micro_batch_size
                rows = tc.micro_batch_size if tc.max_tokens_per_micro_batch is None else 1
                mini_batches = (length_sorted(mb, rows) for mb in mini_batches)

        def loss_fn(logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
            return self.recipe.policy_loss(self.cfg, logp, micro, tokens)

        out = train_epochs(self.train_engine, self._shared(mini_batches), loss_fn, tc.epochs, tc.micro_batch_size)
        # the replicas' readers counted their own shares; their peers saw no samples of their own
        out.update(StalenessCounter.merged(from_readers(staleness, self.replica)).metrics())
        if measured:
            out.update(self._routing_metrics())
        out.update(self.train_engine.memory_metrics())
        role = f"actor{self.rank}" if self.rank else "actor"
        out.update(peak_memory_metrics(role, torch.device(self.cfg.engine.device)))
        self.policy_version += 1
        out["timing/update_s"] = time.perf_counter() - start
        out["timing/update_wait_s"] = waited.seconds
        out["train/policy_version"] = float(self.policy_version)
        return self._report(out)

    def _shared(self, items: Iterable[T] | None) -> Iterable[T]:
        """``items`` as they are (each rank reads its own), or megatron's model groups: each reader's, passed to its
        TP / PP peers."""
        if not self.replica.shares_batches:
            assert items is not None
            return items
        return shared_stream(items, self.reads_dock, self.model_group, src=self.replica.peers[0])

    def _report(self, metrics: dict[str, float]) -> dict[str, float]:
        """What this rank reports of a stage: everything on rank 0 (the stages merge the ranks' results, later
        ones winning a shared key), only its own ``memory/rank<r>/...`` ledger on the other ranks."""
        if self.rank == 0:
            return metrics
        return {k: v for k, v in metrics.items() if k.startswith(f"memory/rank{self.rank}/")}

    def publish_weights(self) -> tuple[dict[str, float], dict[str, Any]]:
        """For the generator workers (disaggregated placement): (metrics with the policy version, the version and
        current weights). Called with ``num_returns=2``, so the driver fetches the metrics and never the weights."""
        start = time.perf_counter()
        # LoRA: vLLM generators take the adapter alone (their base is the run's initial model); HF generators the
        # adapters merged into full HF-named weights, which a generator's plain model loads as they are
        if is_lora(self.policy):
            weights = adapter_tensors(self.policy.named_parameters()) if self.cfg.engine.backend == "vllm" else \
                merged_weights(self.policy)
        else:
            weights = self.train_engine.named_weights()
        published = {"version": self.policy_version, "weights": dict(weights),
                     "probe": self.sync_checker.next_probe(self.policy, len(self.tokenizer))}
        metrics = {"policy_version": float(self.policy_version), "timing/publish_s": time.perf_counter() - start,
                   "reshard/publish_bytes": float(storage_bytes(published["weights"].values()))}
        return metrics, published

    def reshard(self) -> dict[str, float]:
        """Hand the updated weights to the generation engine: dp = 1 the same tensors, nothing copied; dp >= 2
        allgather-swap into the plain generation copy, the update state swapped to host until the next update."""
        start = time.perf_counter()
        self.gen_engine.load_weights(self.train_engine.generation_weights())
        out = {"timing/reshard_s": time.perf_counter() - start}
        if self.gen_engine.samples_with(self.policy):  # HF generation on the policy's own tensors: nothing to check
            return self._report(out)
        probe = self.sync_checker.next_probe(self.policy, len(self.tokenizer))
        if probe is not None:  # WeightSyncError stops the run when the generation engine's weights are not ours
            out[SYNC_CHECK] = self.gen_engine.check_sync(probe)
        return self._report(out)

    def _scoring(self) -> EvalInputs:
        cfg = self.cfg
        return EvalInputs(cfg.eval, cfg.data, cfg.rollout.max_new_tokens, cfg.run.seed, cfg.tools)

    def evaluate(self, split: str = "test", limit: int | None = None, held_out: Any = None) -> dict[str, float]:
        """Held-out scores by the verifier (greedy accuracy; pass@k with eval.pass_k > 1), and the algorithm's own
        held-out metrics (``Algorithm.evaluate``; ``held_out``: the pair source's held-out rows when the run has one,
        e.g. DPO's margin on ``PairSource.eval_pairs``)."""
        start = time.perf_counter()
        examples = getattr(self.task, split)[: limit or None]
        out = evaluate_policy(self.policy, self.tokenizer, examples, self._scoring(), split)
        out.update(self.recipe.evaluate(self.train_engine, self.cfg, held_out))
        out["timing/eval_s"] = time.perf_counter() - start
        return out

    def identity(self, split: str = "test", limit: int | None = None) -> tuple[EvalIdentity, str]:
        """(the identity of ``evaluate(split, limit)``'s evaluation, the task's: ``dockflow.data.task_identity``)."""
        examples = getattr(self.task, split)[: limit or None]
        task = task_identity(self.cfg.data, self.task.val + self.task.train)
        return eval_identity(examples, self._scoring(), self.tokenizer), task

    def score_registered(self, tracking_uri: str, version: int, split: str = "test",
                         limit: int | None = None) -> tuple[float, str]:
        """Version ``version`` of ``registry.model_name``, downloaded to this node and scored as ``evaluate(split,
        limit)`` scores the policy: (its ``registry.score_metric``, the evaluation's fingerprint)."""
        from dockflow.eval.registered import (
            RegisteredScorer,  # MLflow, imported only when a champion is re-scored
        )

        cfg = self.cfg
        device = next(self.policy.parameters()).device
        scorer = RegisteredScorer(tracking_uri, cfg.registry, self._scoring(), cfg.model.dtype, device)
        return scorer.score(version, getattr(self.task, split)[: limit or None], split)

    def extra_state(self) -> dict[str, Any]:
        return {"policy_version": self.policy_version}

    def load_extra(self, state: dict[str, Any]) -> None:
        self.policy_version = state["policy_version"]

    def save_hf(self, path: str) -> str:
        """The current policy as an HF model directory (LoRA: merged, with the adapter in ``adapter/``)."""
        if is_lora(self.policy):
            save_lora_model(self.policy, path)
        else:
            self.policy.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        return path

    def save_final(self, dest: str) -> str:
        """The current policy as an HF model directory staged at ``dest`` (in the checkpoint store: a directory,
        or s3://...), so the run's final model never lives on this worker's disk alone. Returns ``dest``."""
        import tempfile

        from dockflow.storage.objects import stage_model

        with tempfile.TemporaryDirectory(prefix="dockflow-final-") as tmp:
            return stage_model(self.save_hf(tmp), dest, self.cfg.checkpoint)

