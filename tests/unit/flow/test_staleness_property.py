"""Property: whatever the relative speeds of generators and trainer, every sample the update trains on is at
most ``train.max_staleness`` policy versions old, and exactly that once the pipeline is full. The real stage
loops (``streaming.StageLoops`` running ``iteration.RunTasks``) drive fake actors with Ray's ordering rules
(``fake_ray``); the fake update checks ages with the real ``StalenessCounter``."""

from __future__ import annotations

import random
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
from fake_ray import FakeActor, World
from tensordict import TensorDict

from dockflow.config import Config, load_config
from dockflow.data.prompt_order import PromptSampler
from dockflow.flow.iteration import RunParts, RunTasks
from dockflow.flow.run_record import RunRecord
from dockflow.flow.stage_loops import Schedule, StageLoops
from dockflow.rollout.queue import QueueSettings, RolloutQueue
from dockflow.workers import Workers
from dockflow.workers.resources import build_plan
from dockflow.workers.staleness import StalenessCounter

G, N = 8, 2


class FakeDock:
    """Per-sample policy versions by dock index; ``reset`` clears a window."""

    def __init__(self) -> None:
        self.versions: dict[int, int] = {}
        self.writers: dict[int, int] = {}  # dock index -> generator that wrote it

    def reset(self, keep=(), window: tuple[int, int] | None = None) -> None:
        lo, hi = window if window else (0, 1 << 30)
        for i in [i for i in self.versions if lo <= i < hi]:
            del self.versions[i], self.writers[i]

    def put(self, indices: list[int], version: int, writer: int) -> None:
        for i in indices:
            assert i not in self.versions, f"dock index {i} written twice"
            self.versions[i] = version
            self.writers[i] = writer


class FakeTrainer:
    def __init__(self, cfg: Config, dock: FakeDock) -> None:
        self.cfg, self.dock, self.version = cfg, dock, 0
        self.ages: dict[int, list[int]] = {}

    def _window(self, i: int) -> list[int]:
        lo, hi = build_plan(self.cfg).dock_window(i)
        return [self.dock.versions.get(k) for k in range(lo, hi)]

    def ready_for(self, method: str, *args) -> bool:
        return method != "update" or None not in self._window(args[0])

    def compute_old_log_prob(self, i: int) -> dict[str, float]:
        return {"timing/old_log_prob_s": 0.0}

    def update(self, i: int) -> dict[str, float]:
        versions = torch.tensor(self._window(i))
        counter = StalenessCounter(self.version, self.cfg.train.max_staleness)
        data = TensorDict({"response_mask": torch.ones(len(versions), 2, dtype=torch.long)}, batch_size=[len(versions)])
        counter.admit(data, versions)
        self.ages[i] = (self.version - versions).tolist()
        self.version += 1
        return {**counter.metrics(), "timing/update_s": 0.0}

    def publish_weights(self) -> tuple[dict, dict]:
        return {"policy_version": float(self.version)}, {"version": self.version, "weights": {}}


class FakeGenerator:
    def __init__(self, cfg: Config, dock: FakeDock, rank: int) -> None:
        self.cfg, self.dock, self.rank, self.version = cfg, dock, rank, 0
        self.chunks = 0

    def generate(
        self, iteration: int, prompt_ids: list[int], first_index: int = 0, queue=None, rank: int = 0, opened=None,
        weights: dict | None = None,
    ) -> Iterator[None]:
        if weights is not None and weights["version"] > self.version:
            self.version = weights["version"]
        if queue is None:  # alone: a private queue, as GeneratorWorker does
            q = RolloutQueue(QueueSettings(1))
            q.open(iteration, prompt_ids)
        else:
            q = queue._impl  # the shared queue actor, already opened (``opened`` resolved first)
        lo = build_plan(self.cfg).dock_window(iteration)[0] + first_index
        samples = 0
        while (work := q.take(iteration, rank)) is not None:  # one chunk per step: other actors run in between
            first = lo + work.slot * N
            self.dock.put(list(range(first, first + len(work.prompt_ids) * N)), self.version, self.rank)
            samples += len(work.prompt_ids) * N
            self.chunks += 1
            yield
        return {"rollout/samples": float(samples), "rollout/tokens": float(samples), "rollout/prompt_length": 1.0,
                "rollout/response_length": 1.0, "timing/generate_s": 0.0, "rollout/policy_version": float(self.version)}


def run_case(
    seed: int, max_staleness: int, iterations: int = 6, speeds: list[float] | None = None
) -> tuple[FakeTrainer, list[FakeGenerator]]:
    rng = random.Random(seed)
    generators = len(speeds) if speeds else rng.randint(1, 3)
    cfg = load_config("configs/grpo_arith_async.yaml", [
        f"train.max_staleness={max_staleness}", f"placement.generators={generators}",
        f"rollout.prompts_per_iter={G}", f"rollout.group_size={N}", f"rollout.batch_size={N}", "train.mini_batch_size=16",
        "train.micro_batch_size=16",
    ])
    world, dock = World(rng), FakeDock()
    trainer = FakeTrainer(cfg, dock)
    speed = lambda: rng.lognormvariate(0.0, 1.5)  # noqa: E731 - per-actor relative speed
    gens = [FakeGenerator(cfg, dock, k) for k in range(generators)]
    workers = Workers(
        actors=[FakeActor(world, trainer, speed())],
        generators=[FakeActor(world, g, speeds[k] if speeds else speed()) for k, g in enumerate(gens)],
        rollout_queue=FakeActor(world, RolloutQueue(QueueSettings(1)), 1.0),
    )
    sampler = PromptSampler(1000, G, seed)
    start = rng.randint(0, 2)  # a resumed run starts past 0 with the restored version
    trainer.version = start
    state = RunRecord()
    tracker = SimpleNamespace(log_metrics_or_defer=lambda metrics, step: True)
    parts = RunParts(cfg=cfg, plan=build_plan(cfg), workers=workers, dock=dock, sampler=sampler, store=None, tracker=tracker, state=state)
    tasks = RunTasks(parts, start)
    schedule = Schedule(start=start, end=start + iterations, max_staleness=max_staleness, eval_steps=[],
                checkpoint_steps=set(), publish_first=start > 0)
    StageLoops(schedule, tasks, timeout_s=60.0, waiter=world).run()
    assert len(state.history) == iterations and state.iteration == start + iterations
    return trainer, gens


@pytest.mark.parametrize("max_staleness", [0, 1, 2, 3])
def test_no_trained_sample_is_older_than_max_staleness_at_any_speeds(max_staleness):
    for seed in range(25):
        trainer, _ = run_case(seed * 4 + max_staleness, max_staleness)
        first = min(trainer.ages)
        for i, ages in trainer.ages.items():
            assert max(ages) <= max_staleness, (seed, i, ages)
            # Tight: generation runs exactly max_staleness versions ahead once the pipeline is full.
            assert set(ages) == {min(i - first, max_staleness)}, (seed, i, ages)


def test_a_faster_generator_takes_more_chunks_and_every_sample_is_written_once():
    """Generators draw chunks from one queue: with one generator 8x slower, the fast one takes most of them;
    every dock index of every iteration is written exactly once (``FakeDock.put``) before the update runs."""
    trainer, gens = run_case(seed=3, max_staleness=1, iterations=4, speeds=[8.0, 1.0])
    fast, slow = gens[0].chunks, gens[1].chunks
    assert fast + slow == 4 * G  # one group per chunk
    assert fast > 2 * slow, (fast, slow)
    assert len(trainer.ages) == 4
