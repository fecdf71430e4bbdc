"""Which batches each actor rank runs. ``shared_stream`` on 2 gloo ranks: the reader's items (TensorDicts, as
the actor passes them) reach the other rank in order and both streams end together. ``ModelReplica``: megatron's
rank order (TP fastest, then DP, then PP). The actor's routing on 4 gloo ranks at TP=2 x DP=2: the first rank
of each model group alone reads the dock, for its replica's share (``dp_share`` = its replica, half of each
mini-batch and of the iteration), its TP peer trains on exactly its reader's batches, only the readers write
old log-probs, and rank 0 alone reports the stage's metrics, summed over both readers' shares (the others only
their memory ledger)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from fixtures.ranks import start_ranks
from tensordict import TensorDict

from dockflow.config import load_config
from dockflow.dock import DockBatch
from dockflow.engines.routing import RoutingStats
from dockflow.workers.actor import ActorWorker
from dockflow.workers.model_parallel import ModelReplica, model_group, shared_stream
from dockflow.workers.resources import build_plan

R = 4  # response width of the fake samples


def _batches() -> list[TensorDict]:
    return [TensorDict({"x": torch.arange(k * 3, k * 3 + 3)}, batch_size=[3]) for k in range(3)]


def _rank(rank: int, tmp: str) -> None:
    store = dist.FileStore(str(Path(tmp) / "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=30))
    reader = rank == 0
    seen = [b["x"] for b in shared_stream(iter(_batches()) if reader else None, reader)]
    seen_again = list(shared_stream(iter([]) if reader else None, reader))  # an empty stream ends on every rank
    torch.save({"seen": seen, "again": seen_again}, Path(tmp) / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_every_rank_sees_the_readers_batches(tmp_path):
    start_ranks(_rank, (str(tmp_path),), 2)
    expected = [b["x"] for b in _batches()]
    for rank in range(2):
        out = torch.load(tmp_path / f"rank{rank}.pt")
        assert len(out["seen"]) == 3 and all(torch.equal(a, b) for a, b in zip(out["seen"], expected, strict=True))
        assert out["again"] == []


def test_replicas_follow_megatrons_rank_order():
    # TP=2 x DP=2 x PP=2: rank = (pp * 2 + dp) * 2 + tp
    replicas = [ModelReplica(r, tp=2, pp=2, dp=2) for r in range(8)]
    assert [r.index for r in replicas] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert replicas[5].peers == [0, 1, 4, 5] and replicas[6].peers == [2, 3, 6, 7]
    assert [r.rank for r in replicas if r.reads_dock] == replicas[0].readers == [0, 2]
    fsdp = [ModelReplica(r, dp=3) for r in range(3)]  # FSDP2's ranks: every rank its own replica and reader
    assert [(r.index, r.reads_dock, r.shares_batches) for r in fsdp] == [(k, True, False) for k in range(3)]
    assert ModelReplica(1, tp=2).peers == [0, 1] and not ModelReplica(1, tp=2).reads_dock


class FakeDock:
    """What replica ``share``'s reader sees: rows tagged ``share * 100 + k`` of policy version ``version``; records
    what was asked and put."""

    def __init__(self, share: int, version: int) -> None:
        self.share, self.version, self.requests, self.puts, self.served = share, version, [], [], 0

    def get(self, request) -> DockBatch:
        share = self.share
        self.requests.append((request.consumer, request.batch_size, request.dp_share))
        rows = torch.arange(self.served, self.served + request.batch_size) + 100 * share
        self.served += request.batch_size
        mask = torch.ones(len(rows), R, dtype=torch.long)
        data = TensorDict({"row": rows, "input_ids": rows[:, None].repeat(1, 2 * R), "attention_mask": mask.repeat(1, 2),
                           "responses": rows[:, None].repeat(1, R), "response_mask": mask,
                           "rollout_log_prob": torch.full((len(rows), R), -0.1 - 0.2 * share)}, batch_size=[len(rows)])
        return DockBatch(rows.tolist(), data, {"policy_version": torch.full((len(rows),), self.version)})

    def put(self, indices, data) -> None:
        self.puts.append(indices)


class FakeEngine:
    """Records the rows it runs; log-probs 0 (so the drift is the fake rollout log-probs' distance from 0)."""

    def __init__(self, rank: int) -> None:
        self.rank, self.inferred, self.trained = rank, [], []

    def infer(self, batch):
        self.inferred.append(batch["row"].tolist())
        return torch.zeros(batch.batch_size[0], R)

    def train_mini_batch(self, batch, loss_fn, micro_batch_size):
        self.trained.append(sorted(batch["row"].tolist()))
        return {"train/loss": 1.0}

    def memory_metrics(self):
        return {f"memory/rank{self.rank}/update/grads_bytes": float(self.rank)}

    def routing_stats(self):
        return RoutingStats()


def _actor_rank(rank: int, tmp: str) -> None:
    store = dist.FileStore(str(Path(tmp) / "store"), 4)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=4, timeout=timedelta(seconds=30))
    cfg = load_config("configs/grpo_arith.yaml", [
        "train.engine=megatron", "train.tp=2", "train.dp=2", "rollout.prompts_per_iter=4", "rollout.group_size=4",
        "train.mini_batch_size=8", "train.micro_batch_size=2", "train.infer_batch_size=4"])
    actor = ActorWorker.__new__(ActorWorker)  # the worker's routing, without a model or Ray
    actor.cfg, actor.plan, actor.rank, actor.dp = cfg, build_plan(cfg), rank, 2
    actor.recipe = actor.plan.recipe
    actor.columns = actor.plan.role("actor").reads
    actor.replica = ModelReplica(rank, tp=2, dp=2)
    actor.model_group = model_group(actor.replica)
    actor.train_engine, actor.policy_version = FakeEngine(rank), 1
    actor.dock = FakeDock(actor.replica.index, 1) if actor.reads_dock else None
    infer = actor.compute_old_log_prob(1)
    if actor.dock is not None:  # replica 1's update samples one version old: past train.max_staleness=0, dropped
        actor.dock.version = 1 - actor.replica.index
    out = {"infer": infer, "update": actor.update(1), "inferred": actor.train_engine.inferred,
           "trained": actor.train_engine.trained}
    if actor.dock is not None:
        out |= {"requests": actor.dock.requests, "puts": actor.dock.puts}
    torch.save(out, Path(tmp) / f"actor{rank}.pt")
    dist.destroy_process_group()


def test_each_replica_reads_its_share_and_rank_0_reports(tmp_path):
    start_ranks(_actor_rank, (str(tmp_path),), 4)
    ranks = [torch.load(tmp_path / f"actor{r}.pt", weights_only=False) for r in range(4)]
    for reader, peer in ((0, 1), (2, 3)):
        share = reader // 2
        assert "requests" in ranks[reader] and "requests" not in ranks[peer]
        # old log-probs: half the iteration's 16 samples in batches of 4; the update: half of each mini-batch of 8
        assert ranks[reader]["requests"] == [("actor_infer", 4, None)] * 2 + [("actor_update", 4, (share, 2))] * 2
        assert len(ranks[reader]["puts"]) == 2  # the reader writes old_log_prob; its peer writes nothing
        for stage in ("inferred", "trained"):
            assert ranks[peer][stage] == ranks[reader][stage] and len(ranks[reader][stage]) == 2
            assert all(row // 100 == share for rows in ranks[reader][stage] for row in rows)
    assert ranks[0]["trained"] != ranks[2]["trained"]
    infer, update = ranks[0]["infer"], ranks[0]["update"]
    # both readers' shares: 8 samples of age 0 (replica 0), 8 of age 1 dropped (replica 1)
    assert (update["staleness/age_0"], update["staleness/age_1"], update["staleness/dropped"]) == (8.0, 8.0, 8.0)
    # the rollout-vs-trainer drift over both shares: 0.1 on replica 0's tokens, 0.3 on replica 1's
    assert abs(infer["rollout/logprob_abs_diff_mean"] - 0.2) < 1e-6 and abs(infer["rollout/logprob_abs_diff_max"] - 0.3) < 1e-6
    assert update["train/loss"] == 1.0 and "timing/update_s" in update and "timing/old_log_prob_s" in infer
    for rank in (1, 2, 3):  # their own memory ledger and nothing else, so they cannot overwrite rank 0's metrics
        assert ranks[rank]["infer"] == {}
        assert ranks[rank]["update"] == {f"memory/rank{rank}/update/grads_bytes": float(rank)}
