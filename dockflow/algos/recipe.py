"""What an algorithm is to DockFlow: one ``Algorithm`` (a recipe) per algorithm, in ``dockflow.algos.recipes``.

A recipe holds everything that differs between algorithms, so no other room compares an algorithm's name:

- its config section (``section``: the ``algorithm:`` block of a config, one pydantic model per algorithm,
  picked by ``algorithm.name``), and its own config checks with their reasons (``check``);
- the worker states it runs and the columns each reads (``consumers``): a critic, a reference, offline pairs;
- how rewards are shaped (``shape_rewards``), its advantage estimator (``advantages``) and its policy loss
  (``policy_loss``);
- how an iteration is sized: its sampling (``sampling``: rounds, quota, group selector), samples trained
  (``train_batch``).

Recipe modules are light (pydantic only): they import their tensor functions inside the methods, so loading a
config never imports torch. The tensor functions live in ``dockflow.algos`` (``grpo.py``, ``ppo.py``, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from dockflow.algos.plan import REWARD_MODEL_CONSUMER, SNAPSHOT_CONSUMER, Role, RunPlan, Sampling, role
from dockflow.config.base import Section

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config

ROLLOUT = ["input_ids", "attention_mask", "responses"]  # what a forward pass over a rollout reads


class AlgorithmSection(Section):
    """Fields every algorithm's section has; a recipe's section adds its own (``name`` is a Literal there)."""

    name: str

    @property
    def recipe(self) -> Algorithm:
        from dockflow.algos.recipes import recipe_of

        return recipe_of(self.name)


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


class RoleSection(Section):
    """Settings a worker role reads through the plan (``Role.section``), not by the algorithm's name; ``key`` is
    where they sit in a config, so that a message names the key to change."""

    key: ClassVar[str]

    def key_of(self, field: str) -> str:
        """The dotted config key of one of these settings (``algorithm.dpo.pairs_path``)."""
        return f"{self.key}.{field}"


class CriticSection(RoleSection):
    """What the critic worker reads: its value clip and learning rate."""

    value_clip: float = Field(0.2, gt=0.0, description="Clip range of the value update around the old values.")
    critic_lr: float = Field(1e-3, gt=0.0, description="Critic learning rate (AdamW).")


class PreferenceSection(RoleSection):
    """What the pair source reads: the preference pairs' file and the held-out count."""

    pairs_path: str | None = Field(
        None, description="JSONL of {prompt, chosen, rejected} (a local path or s3://); null = synthetic pairs from the task."
    )
    num_eval_pairs: int = Field(200, ge=1, description="Held-out pairs (from the test split) for the margin metric.")


class Algorithm:
    """One algorithm's recipe (an instance per algorithm, ``dockflow.algos.recipes.RECIPES``)."""

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

    # ---- worker states ----

    def uses_reference(self, cfg: Config) -> bool:
        return getattr(cfg.algorithm, "kl_coef", 0.0) > 0

    def kl_in_loss(self, cfg: Config) -> bool:
        return self.kl == "loss" and self.uses_reference(cfg) and not self.offline

    def kl_in_reward(self, cfg: Config) -> bool:
        return self.kl == "reward" and self.uses_reference(cfg)

    def consumers(self, cfg: Config) -> dict[str, list[str]]:
        """Worker state -> the columns it reads (each one a controller of the dock)."""
        infer = [*ROLLOUT, "advantages"] if self.sampling(cfg).in_rounds else list(ROLLOUT)  # selected groups only
        advantage = ["rewards", "response_mask"]
        if self.critic:
            advantage.append("values")
        if self.kl_in_reward(cfg):
            advantage += ["old_log_prob", "ref_log_prob"]
        reward = ["responses", "response_mask", *(["tool_record"] if cfg.tools.enabled else [])]  # + conversations
        out = {"reward": reward, "advantage": advantage}
        if cfg.train.old_log_prob == "recompute":  # else generation writes old_log_prob itself
            out["actor_infer"] = [*infer, "response_mask", "rollout_log_prob"]  # + the rollout-vs-trainer drift
        if self.uses_reference(cfg):
            out["ref_infer"] = list(infer)
        if self.critic:
            out["critic_infer"] = list(ROLLOUT)
            out["critic_update"] = [*ROLLOUT, "response_mask", "values", "returns"]
        update = [*ROLLOUT, "response_mask", "old_log_prob", "advantages"]
        if self.kl_in_loss(cfg):
            update.append("ref_log_prob")
        if cfg.train.tis_cap is not None:
            update.append("rollout_log_prob")
        out["actor_update"] = update
        return out

    # ---- the run plan ----

    def critic_section(self, cfg: Config) -> CriticSection | None:
        """The critic's settings (value clip, learning rate, ...) when this algorithm has a critic worker."""
        return None

    def pairs_section(self, cfg: Config) -> PreferenceSection | None:
        """The preference pairs' settings (file, held-out count) when this algorithm trains offline on pairs."""
        return None

    def sampling(self, cfg: Config) -> Sampling:
        """How an iteration's samples are drawn (one round of G prompts unless the algorithm selects groups)."""
        return Sampling(rounds=1, quota=cfg.rollout.prompts_per_iter)

    def plan(self, cfg: Config) -> RunPlan:
        """The run plan of ``cfg``: its roles with counts, resources, dock columns and sections; its sampling."""
        states = self.consumers(cfg)
        generated = [*ROLLOUT, "response_mask", "rollout_log_prob"]
        if cfg.train.old_log_prob == "rollout":
            generated.append("old_log_prob")
        if cfg.tools.enabled:  # each trajectory's conversation and environment, for the reward functions
            generated.append("tool_record")

        def owned(*names: str) -> dict[str, tuple[str, ...]]:
            return {n: tuple(states[n]) for n in names if n in states}

        rl, ray, placement = not self.offline, cfg.ray, cfg.placement
        generators = placement.generators if placement.mode == "disaggregated" else 0
        ranks, critics = cfg.train.actor_ranks, int(self.critic) * cfg.train.critic_ranks
        roles = [  # ray.actor_cpus (ray.critic_cpus) is the whole actor's (critic's), shared by its ranks
            role(cfg, "actor", ranks, ray.actor_cpus / ranks, reads=owned("actor_infer", "actor_update"),
                 writes=("old_log_prob", *(generated if rl and not generators else ()))),
            role(cfg, "generator", generators, placement.generator_cpus, writes=tuple(generated)),
            role(cfg, "rollout_queue", 1 if generators > 1 else 0, 0.0),
            role(cfg, "reference", int(self.uses_reference(cfg)), ray.reference_cpus, reads=owned("ref_infer"),
                 writes=("ref_log_prob",)),
            role(cfg, "critic", critics, ray.critic_cpus / max(critics, 1),
                 reads=owned("critic_infer", "critic_update"), writes=("values",), section=self.critic_section(cfg)),
            role(cfg, "reward", int(rl), 0.0, reads=owned("reward", "advantage"),
                 writes=("rewards", "advantages", *(("returns",) if self.critic else ()))),
            role(cfg, "reward_model", int(rl and bool(cfg.reward.models)), cfg.reward.model_cpus,
                 reads={REWARD_MODEL_CONSUMER: tuple(ROLLOUT + ["response_mask"])}, writes=("rm_scores",)),
            role(cfg, "pairs", int(self.offline), 0.0, writes=(*ROLLOUT, "response_mask"),
                 section=self.pairs_section(cfg)),
        ]
        planned = {r.name: r for r in roles if r.count > 0}
        if "reward_model" in planned:  # the reward state waits for the reward models' scores
            reward = planned["reward"]
            reads = {**reward.reads, "reward": (*reward.reads["reward"], "rm_scores")}
            planned["reward"] = Role(reward.name, reward.count, reward.cpus, reward.devices, reads, reward.writes)
        extra = {}
        if generators and cfg.train.max_staleness > 0:
            extra[SNAPSHOT_CONSUMER] = tuple(generated)
        return RunPlan(roles=planned, sampling=self.sampling(cfg), global_batch=cfg.global_batch,
                       train_batch=self.train_batch(cfg), extra_consumers=extra)

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
        from dockflow.algos.grpo import clipped_policy_loss
        from dockflow.algos.tis import truncated_is_weights

        alg, kl = cfg.algorithm, self.kl_in_loss(cfg)
        cap = cfg.train.tis_cap
        tis = None if cap is None else truncated_is_weights(
            micro["old_log_prob"], micro["rollout_log_prob"], micro["response_mask"], cap)
        out = clipped_policy_loss(
            logp, micro["old_log_prob"], micro["advantages"], micro["response_mask"], clip_eps=alg.clip_eps,
            clip_eps_high=self.clip_eps_high(cfg), ref_logp=micro["ref_log_prob"] if kl else None,
            kl_coef=alg.kl_coef if kl else 0.0, kl_estimator=alg.kl_estimator, token_denom=tokens,
            token_weights=None if tis is None else tis.weights,
        )
        metrics = {
            "train/pg_loss": float(out.pg_loss), "train/kl": float(out.kl), "train/clip_fraction": float(out.clip_fraction),
            "train/approx_kl_old": float(out.approx_kl_old),
            "train/loss": float(out.loss.detach()) * tokens / max(float(micro["response_mask"].sum()), 1.0),
        }
        if tis is not None:
            metrics["train/tis_weight_mean"] = float(tis.mean)
            metrics["train/tis_truncated_fraction"] = float(tis.truncated_fraction)
        return out.loss, metrics

    def clip_eps_high(self, cfg: Config) -> float | None:
        """The upper ratio clip (None: symmetric)."""
        return None

    def token_kl(self, cfg: Config, data: TensorDict) -> torch.Tensor | None:
        """Per-token KL to the reference, for algorithms that put it into the reward."""
        if not self.kl_in_reward(cfg):
            return None
        from dockflow.algos.kl import kl_penalty

        return kl_penalty(data["old_log_prob"], data["ref_log_prob"], cfg.algorithm.kl_estimator)

    def summary(self, scores: list[tuple[int, dict[str, float]]]) -> dict[str, Any]:
        """Extra ``summary.json`` keys from the held-out evaluations ``[(step, scores), ...]``."""
        return {}
