"""What an algorithm is to DockFlow: an ``Algorithm`` (its recipe), one module per algorithm in ``dockflow.algos``.

A recipe holds everything that differs between algorithms, so no other room compares an algorithm's name. Each
algorithm's module writes out (or names, when it is shared) its

- config section (``section``: the ``algorithm:`` block of a config, picked by ``algorithm.name``) and its own
  config checks with their reasons (``check``);
- worker states and the columns each reads (``consumers``: ``policy_gradient_columns`` for the on-line ones);
- advantage estimator (``advantages``: ``dockflow.algos.groups.group_normalised`` for the GRPO family) and
  policy loss (``policy_loss``: ``dockflow.algos.losses.clipped_surrogate`` for the clipped surrogate);
- and, where it differs from one round of G prompts, its sampling (``sampling``) and samples trained
  (``train_batch``), its reward shaping (``shape_rewards``), its evaluation metrics (``evaluate``).

This base class has the defaults of those that most algorithms share (no check, one round, the scores as rewards)
and the run plan's roles (``plan``: ``dockflow.algos.plan.plan_roles``); it decides no resources (the workers
size the roles: ``dockflow.workers.resources``). Recipe modules are light (pydantic only): they import torch
inside the functions, so loading a config never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from dockflow.algos.plan import RunPlan, Sampling, plan_roles
from dockflow.config.algorithm import AlgorithmSection, CriticSection, PreferenceSection
from dockflow.config.router_replay import records_routing

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config

ROLLOUT = ["input_ids", "attention_mask", "responses"]  # what a forward pass over a rollout reads


class PolicyGradientSection(AlgorithmSection):
    """The clipped policy-gradient algorithms' shared knobs."""

    clip_eps: float = Field(0.2, gt=0.0, description="PPO-style ratio clip: the ratio stays in [1 - clip_eps, 1 + clip_eps].")
    kl_coef: float = Field(
        0.0, ge=0.0, description="KL to the reference policy: a loss term or a token reward, as the algorithm says (0: no reference worker)."
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator (Schulman's k1/k2/k3).")


class GroupNormSection(PolicyGradientSection):
    """Group-relative advantages (GRPO and its variants)."""

    norm_adv_by_std: bool = Field(True, description="Divide group-centred rewards by the group std.")
    adv_eps: float = Field(1e-6, gt=0.0, description="Added to the std when normalising advantages.")


class Algorithm:
    """One algorithm's recipe (an instance per algorithm, ``dockflow.algos.RECIPES``)."""

    name: ClassVar[str]
    section: ClassVar[type[AlgorithmSection]]
    offline: ClassVar[bool] = False  # trains on a dataset's preference pairs: no rollouts, no reward worker
    critic: ClassVar[bool] = False  # a critic worker estimates values (GAE)
    kl: ClassVar[Literal["loss", "reward"]] = "loss"  # where algorithm.kl_coef applies
    group_advantages: ClassVar[bool] = True  # advantages within each group: any whole number of groups per batch
    paired_rows: ClassVar[bool] = False  # rows come as (chosen, rejected) pairs: keep them together and in order

    # ---- shape of an iteration ----

    def train_batch(self, cfg: Config) -> int:
        """Samples the update trains on per iteration."""
        return cfg.global_batch

    def check(self, cfg: Config) -> None:
        """Raise ValueError, with the reason and the keys to change, for a config this algorithm cannot run."""

    def sampling(self, cfg: Config) -> Sampling:
        """How an iteration's samples are drawn (one round of G prompts unless the algorithm selects groups)."""
        return Sampling(rounds=1, quota=cfg.rollout.prompts_per_iter)

    def samples_in_rounds(self, cfg: Config) -> bool:
        return self.sampling(cfg).in_rounds

    # ---- worker states ----

    def uses_reference(self, cfg: Config) -> bool:
        return getattr(cfg.algorithm, "kl_coef", 0.0) > 0

    def kl_in_loss(self, cfg: Config) -> bool:
        return self.kl == "loss" and self.uses_reference(cfg) and not self.offline

    def kl_in_reward(self, cfg: Config) -> bool:
        return self.kl == "reward" and self.uses_reference(cfg)

    def consumers(self, cfg: Config) -> dict[str, list[str]]:
        """Worker state -> the columns it reads (each one a controller of the dock)."""
        raise NotImplementedError(f"algorithm {self.name!r} names no worker states")

    def critic_section(self, cfg: Config) -> CriticSection | None:
        """The critic's settings (value clip, learning rate, ...) when this algorithm has a critic worker."""
        return None

    def pairs_section(self, cfg: Config) -> PreferenceSection | None:
        """The preference pairs' settings (file, held-out count) when this algorithm trains offline on pairs."""
        return None

    def plan(self, cfg: Config) -> RunPlan:
        """The run plan's roles (counts, dock columns, sections) and sampling; the workers size them
        (``dockflow.workers.resources.build_plan``)."""
        return plan_roles(cfg, self)

    # ---- the math ----

    def shape_rewards(self, cfg: Config, scores: torch.Tensor, response_length: torch.Tensor) -> torch.Tensor:
        """The verifier's scores -> the rewards the advantage state reads."""
        return scores

    def advantage_batch_size(self, cfg: Config) -> int:
        """Group-relative estimators take any whole number of groups; batch-normalised ones the whole batch."""
        n = cfg.rollout.group_size
        if self.group_advantages:
            return max(n, (cfg.train.infer_batch_size // n) * n)
        return cfg.global_batch

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        """(positions of ``data`` that get advantages, their columns: ``advantages`` [B, R], maybe ``returns``)."""
        raise NotImplementedError(f"algorithm {self.name!r} has no advantage state")

    def policy_loss(self, cfg: Config, logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The actor's loss on one micro-batch (``tokens``: response tokens of the whole mini-batch), and metrics."""
        raise NotImplementedError(f"algorithm {self.name!r} has no policy loss")

    def token_kl(self, cfg: Config, data: TensorDict) -> torch.Tensor | None:
        """Per-token KL to the reference, for algorithms that put it into the reward."""
        if not self.kl_in_reward(cfg):
            return None
        from dockflow.algos.kl import kl_penalty

        return kl_penalty(data["old_log_prob"], data["ref_log_prob"], cfg.algorithm.kl_estimator)

    # ---- evaluation ----

    def evaluate(self, engine: Any, cfg: Config, pairs: Any) -> dict[str, float]:
        """Extra held-out metrics of the actor's ``engine`` (a ``TrainingEngine``), from the pair source's held-out
        ``pairs`` when the run has one (DPO's margin); none by default."""
        return {}

    def summary(self, scores: list[tuple[int, dict[str, float]]]) -> dict[str, Any]:
        """Extra ``summary.json`` keys from the held-out evaluations ``[(step, scores), ...]``."""
        return {}


def policy_gradient_columns(cfg: Config, recipe: Algorithm) -> dict[str, list[str]]:
    """The on-line algorithms' worker states and their columns: reward, advantage (with the critic's values, the
    KL's log-probs when it is a reward), the actor's inference and update, the reference's and the critic's."""
    infer = [*ROLLOUT, "advantages"] if recipe.sampling(cfg).in_rounds else list(ROLLOUT)  # selected groups only
    advantage = ["rewards", "response_mask"]
    if recipe.critic:
        advantage.append("values")
    if recipe.kl_in_reward(cfg):
        advantage += ["old_log_prob", "ref_log_prob"]
    reward = ["responses", "response_mask", *(["tool_record"] if cfg.tools.enabled else [])]  # + conversations
    out = {"reward": reward, "advantage": advantage}
    if cfg.train.old_log_prob == "recompute":  # else generation writes old_log_prob itself
        out["actor_infer"] = [*infer, "response_mask", "rollout_log_prob"]  # + the rollout-vs-trainer drift
    if recipe.uses_reference(cfg):
        out["ref_infer"] = list(infer)
    if recipe.critic:
        out["critic_infer"] = list(ROLLOUT)
        out["critic_update"] = [*ROLLOUT, "response_mask", "values", "returns"]
    update = [*ROLLOUT, "response_mask", "old_log_prob", "advantages"]
    if recipe.kl_in_loss(cfg):
        update.append("ref_log_prob")
    if cfg.train.rollout_correction.mode is not None:
        update.append("rollout_log_prob")
    out["actor_update"] = update
    if records_routing(cfg):  # an MoE policy's recorded experts: replayed, and the mismatch measured where
        replay = cfg.train.router_replay == "replay"  # the actor's first pass over the rollout runs
        wanted = {"actor_infer": True, "ref_infer": replay, "actor_update": replay or "actor_infer" not in out}
        for state, reads in wanted.items():
            if reads and state in out:
                out[state].append("routed_experts")
    return out
