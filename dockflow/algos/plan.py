"""The run plan: what one run needs, a value built once by the driver from its config and passed on.

    plan = build_plan(cfg)               # dockflow.workers.resources: the recipe's roles (plan_roles), sized
    plan.recipe                          # the algorithm (dockflow.algos.base.Algorithm): its advantages, its loss
    plan.role("critic")                  # Role(name="critic", count=1, cpus=1.0, devices=0, reads=..., section=PPOConfig)
    plan.consumers()                     # dock consumer state -> the columns it reads (the dock's controllers)
    plan.sampling.rounds                 # generation rounds per iteration (DAPO's dynamic sampling: up to max_rounds)
    plan.dock_window(i)                  # the dock indices of iteration i's samples; plan.dock_capacity, plan.train_batch
    plan.reference_in_actor              # model.lora: the actor's base model (adapter off) is the reference

Every room that asks "which workers does this run have, on what resources, reading and writing which columns,
with which settings" reads the plan (worker creation, the device checks, the dock's consumers, Eq. 5's device
count, the stage loops); none re-derives it, and none outside ``dockflow.algos`` reads an algorithm's section by
name: a role carries the section it reads (``Role.section``: the critic's, the pair source's).

Pure data (dataclasses, no torch, no Ray), picklable: the driver passes it to every worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, TypeVar

from dockflow.config.router_replay import records_routing

if TYPE_CHECKING:
    import torch

    from dockflow.algos.base import Algorithm
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
    cpus: float = 0.0  # Ray CPUs per worker (the workers size it: dockflow.workers.resources)
    devices: float = 0.0  # accelerators per worker, of engine.device's kind (0 on cpu; a fraction shares one)
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
    """A sampling policy's choice of groups (DAPO's dynamic sampling: ``dockflow.algos.dapo.DynamicSampling``)."""

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
    """The run's roles, its dock consumers, its sampling policy and its algorithm (``plan_roles``, sized by
    ``dockflow.workers.resources.build_plan``)."""

    roles: dict[str, Role]  # only the roles the run has (count > 0), by name
    sampling: Sampling
    global_batch: int  # G x N: samples per round
    train_batch: int  # samples the policy update trains on per iteration
    extra_consumers: dict[str, tuple[str, ...]] = field(default_factory=dict)  # states no role owns (snapshot)
    recipe: Algorithm | None = None  # the algorithm: its advantages, its loss, its reward shaping
    max_staleness: int = 0  # train.max_staleness: iterations generation may run ahead of the update
    # model.lora: the reference policy is the actor's own base model (its adapter off), so the actor ranks write
    # ref_log_prob and there is no reference worker, nor a copy of its weights
    reference_in_actor: bool = False
    # generation records each token's experts (routed_experts: an MoE policy on the HF engine, single-turn)
    records_routing: bool = False

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

    @property
    def dock_capacity(self) -> int:
        """Samples the dock holds: 1 + max_staleness iterations of the window (rounds x G x N)."""
        return (1 + self.max_staleness) * self.window

    def dock_window(self, iteration: int) -> tuple[int, int]:
        """The dock indices ``[lo, hi)`` of ``iteration``'s samples: iterations take turns over the windows."""
        size = self.window
        lo = iteration % (1 + self.max_staleness) * size
        return lo, lo + size


def plan_roles(cfg: Config, recipe: Algorithm) -> RunPlan:
    """The roles ``recipe`` needs under ``cfg`` (counts, dock columns read and written, sections), its sampling and
    batch sizes; no resources yet (``cpus``/``devices`` 0: ``dockflow.workers.resources.size_roles``)."""
    states = recipe.consumers(cfg)
    generated = ["input_ids", "attention_mask", "responses", "response_mask", "rollout_log_prob"]
    if cfg.train.old_log_prob == "rollout":
        generated.append("old_log_prob")
    if cfg.tools.enabled:  # each trajectory's conversation and environment, for the reward functions
        generated.append("tool_record")
    if records_routing(cfg):  # an MoE policy's experts per token, for routing replay and moe/routing_mismatch
        generated.append("routed_experts")

    def owned(*names: str) -> dict[str, tuple[str, ...]]:
        return {n: tuple(states[n]) for n in names if n in states}

    rl, placement = not recipe.offline, cfg.placement
    reference = recipe.uses_reference(cfg)
    in_actor = reference and cfg.model.lora is not None  # LoRA: the base model is the reference
    generators = placement.generators if placement.mode == "disaggregated" else 0
    rollout = ("input_ids", "attention_mask", "responses")
    roles = [
        Role("actor", cfg.train.actor_ranks,
             reads=owned("actor_infer", "actor_update", *(("ref_infer",) if in_actor else ())),
             writes=("old_log_prob", *(("ref_log_prob",) if in_actor else ()),
                     *(generated if rl and not generators else ()))),
        Role("generator", generators, writes=tuple(generated)),
        Role("rollout_queue", 1 if generators > 1 else 0),
        Role("reference", int(reference and not in_actor), reads=owned("ref_infer"), writes=("ref_log_prob",)),
        Role("critic", int(recipe.critic) * cfg.train.critic_ranks, reads=owned("critic_infer", "critic_update"),
             writes=("values",), section=recipe.critic_section(cfg)),
        Role("reward", int(rl), reads=owned("reward", "advantage"),
             writes=("rewards", "advantages", *(("returns",) if recipe.critic else ()))),
        Role("reward_model", int(rl and bool(cfg.reward.models)),
             reads={REWARD_MODEL_CONSUMER: (*rollout, "response_mask")}, writes=("rm_scores",)),
        Role("pairs", int(recipe.offline), writes=(*rollout, "response_mask"), section=recipe.pairs_section(cfg)),
    ]
    planned = {r.name: r for r in roles if r.count > 0}
    if "reward_model" in planned:  # the reward state waits for the reward models' scores
        reward = planned["reward"]
        planned["reward"] = replace(reward, reads={**reward.reads, "reward": (*reward.reads["reward"], "rm_scores")})
    extra = {}
    if generators and cfg.train.max_staleness > 0:
        extra[SNAPSHOT_CONSUMER] = tuple(generated)
    return RunPlan(roles=planned, sampling=recipe.sampling(cfg), global_batch=cfg.global_batch,
                   train_batch=recipe.train_batch(cfg), extra_consumers=extra, recipe=recipe,
                   max_staleness=cfg.train.max_staleness, reference_in_actor=in_actor,
                   records_routing="routed_experts" in generated)
