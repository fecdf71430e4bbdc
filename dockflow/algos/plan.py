"""The run plan: what one run needs, derived once from its config by the algorithm's recipe.

    plan = cfg.plan                      # = cfg.algorithm.recipe.plan(cfg)
    plan.role("critic")                  # Role(name="critic", count=1, cpus=1.0, devices=0, reads=..., section=PPOConfig)
    plan.consumers()                     # dock consumer state -> the columns it reads (the dock's controllers)
    plan.sampling.rounds                 # generation rounds per iteration (DAPO's dynamic sampling: up to max_rounds)

Every room that asks "which workers does this run have, on what resources, reading and writing which columns,
with which settings" reads the plan (worker creation, the device checks, the dock's consumers, Eq. 5's device
count, the stage loops); none re-derives it, and none outside ``dockflow.algos`` reads an algorithm's section by
name: a role carries the section it reads (``Role.section``: the critic's, the pair source's).

Pure data (dataclasses, no torch, no Ray), picklable: workers receive their own ``Role``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import torch

    from dockflow.config import Config
    from dockflow.config.base import Section

# The worker roles a run may have. A role owns one or more worker states of the dock (``Role.reads``).
ROLES = ("actor", "generator", "reference", "critic", "reward", "reward_model", "pairs", "rollout_queue")
MODEL_ROLES = ("actor", "generator", "reference", "critic")  # hold a policy-sized model: one accelerator each
REWARD_MODEL_CONSUMER = "reward_model"  # with reward.models: reads rollouts, writes rm_scores (workers/reward_model.py)
SNAPSHOT_CONSUMER = "snapshot"  # reads what generation wrote ahead into a checkpoint (disaggregated, max_staleness > 0)
S = TypeVar("S", bound="Section")


@dataclass(frozen=True)
class Role:
    """One kind of worker in the run: how many, what each asks Ray for, what it reads and writes in the dock."""

    name: str
    count: int  # workers of this role (actor ranks: train.actor_ranks; critic: train.critic_ranks; generators: placement.generators)
    cpus: float  # Ray CPUs per worker
    devices: float  # accelerators per worker, of engine.device's kind (0 on cpu; a fraction shares one)
    reads: dict[str, tuple[str, ...]] = field(default_factory=dict)  # its dock consumer states -> their columns
    writes: tuple[str, ...] = ()  # the dock columns it puts
    section: Section | None = None  # the algorithm's settings it reads (the critic's, the pair source's), if any

    @property
    def total_devices(self) -> float:
        return self.count * self.devices


@dataclass(frozen=True)
class GroupSelection:
    """Which groups of a scored batch get advantages (positions in the batch's group order), and how many of
    them were taken only to fill the iteration (uninformative ones, on the last round)."""

    groups: list[int]
    filled: int = 0


class GroupSelector(Protocol):
    """A sampling policy's choice of groups (DAPO's dynamic sampling: ``recipes/dapo.py``)."""

    def select(self, rewards: torch.Tensor, group_size: int, wanted: int, last_round: bool) -> GroupSelection:
        """From one batch of whole groups (``rewards`` [B]), up to ``wanted`` groups to train on."""
        ...

    def metrics(self, kept: int, filled: int, rounds: int) -> dict[str, float]:
        """The iteration's sampling metrics: groups kept, groups that only filled the batch, rounds run."""
        ...


@dataclass(frozen=True)
class Sampling:
    """How an iteration's samples are drawn: ``rounds`` of G prompts at most; with a ``selector``, each round is
    scored at once and only the groups it selects get advantages, until ``quota`` groups have them."""

    rounds: int = 1
    quota: int = 0  # groups an iteration trains on (G)
    selector: GroupSelector | None = None

    @property
    def in_rounds(self) -> bool:
        return self.selector is not None


@dataclass(frozen=True)
class RunPlan:
    """The run's roles, its dock consumers and its sampling policy (``Algorithm.plan``)."""

    roles: dict[str, Role]  # only the roles the run has (count > 0), by name
    sampling: Sampling
    global_batch: int  # G x N: samples per round
    train_batch: int  # samples the policy update trains on per iteration
    extra_consumers: dict[str, tuple[str, ...]] = field(default_factory=dict)  # states no role owns (snapshot)

    def has(self, name: str) -> bool:
        return name in self.roles

    def role(self, name: str) -> Role:
        try:
            return self.roles[name]
        except KeyError:
            raise KeyError(f"this run has no {name!r} worker (its roles: {sorted(self.roles)})") from None

    def section(self, name: str, kind: type[S]) -> S:
        """The settings role ``name`` reads (``Role.section``), which must be a ``kind``."""
        section = self.role(name).section
        if not isinstance(section, kind):
            raise TypeError(f"the {name} worker reads {type(section).__name__}, not {kind.__name__}")
        return section

    def consumers(self) -> dict[str, list[str]]:
        """Dock consumer state -> the columns it reads: every role's states, then the others (the snapshot)."""
        out = {state: list(cols) for r in self.roles.values() for state, cols in r.reads.items()}
        out.update({state: list(cols) for state, cols in self.extra_consumers.items()})
        return out

    def devices(self) -> dict[str, float]:
        """Accelerators asked for, by role (the roles that hold any)."""
        return {r.name: r.total_devices for r in self.roles.values() if r.total_devices}

    def model_cpus(self) -> float:
        """ND of Eq. (5): the cores reserved by the model workers (generators and reward models included)."""
        return sum(r.count * r.cpus for r in self.roles.values() if r.name in (*MODEL_ROLES, "reward_model"))

    @property
    def window(self) -> int:
        """Dock slots one iteration uses: rounds x G x N."""
        return self.sampling.rounds * self.global_batch


def devices_per_worker(cfg: Config, role: str) -> float:
    """Accelerators one worker of ``role`` holds: a generating worker (actor, generator) on the vLLM backend holds
    ``engine.vllm.tensor_parallel_size`` (the generation layout's TP; training uses the first); the reward-model
    worker ``reward.model_devices`` (a fraction shares one); other model workers 1; the rest none."""
    if cfg.engine.device == "cpu":
        return 0
    if role == "reward_model":
        return cfg.reward.model_devices
    if role not in MODEL_ROLES:
        return 0
    if role in ("actor", "generator") and cfg.engine.backend == "vllm":
        return int(cfg.engine.vllm.tensor_parallel_size)
    return 1


def role(cfg: Config, name: str, count: int, cpus: float, **kw: Any) -> Role:
    """A role of ``count`` workers with this config's devices per worker."""
    return Role(name=name, count=count, cpus=cpus, devices=devices_per_worker(cfg, name), **kw)
