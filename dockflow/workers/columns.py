"""The dock's column schema, and which worker states each algorithm runs and which columns they read.

Each consumer is one worker state (the paper's controllers, one per state). A worker reads exactly the
columns listed here from the dock and writes its output columns back:

    state          writes                         algorithms
    reward         rewards                        all but DPO
    advantage      advantages (+ returns)         all but DPO
    actor_infer    old_log_prob                   all but DPO
    ref_infer      ref_log_prob                   DPO, or any with algorithm.kl_coef > 0
    critic_infer   values                         PPO, PF-PPO
    actor_update   (the policy)                   all
    critic_update  (the critic)                   PPO, PF-PPO
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dockflow.config import Config

if TYPE_CHECKING:
    from dockflow.dock import TransferDock

COLUMNS: dict[str, torch.dtype] = {
    "input_ids": torch.long,
    "attention_mask": torch.long,
    "responses": torch.long,
    "response_mask": torch.long,
    "rewards": torch.float32,
    "advantages": torch.float32,  # [B, R]: per token (sequence-level estimators broadcast over the response)
    "returns": torch.float32,  # [B, R]: the critic's regression target
    "values": torch.float32,  # [B, R]: the critic's value before each response token
    "old_log_prob": torch.float32,
    "ref_log_prob": torch.float32,
    "rollout_log_prob": torch.float32,  # [B, R]: the generating engine's log-probs (behaviour policy, for TIS)
}

ROLLOUT_COLUMNS = ("input_ids", "attention_mask", "responses", "response_mask")
_FORWARD = ["input_ids", "attention_mask", "responses"]  # what a forward pass over a rollout needs

KL_IN_REWARD = ("ppo", "pf_ppo", "reinforce_pp", "reinforce_pp_baseline")


def uses_critic(cfg: Config) -> bool:
    return cfg.algorithm.name in ("ppo", "pf_ppo")


def uses_reference(cfg: Config) -> bool:
    return cfg.algorithm.name == "dpo" or cfg.algorithm.kl_coef > 0


def kl_in_reward(cfg: Config) -> bool:
    """PPO-family algorithms subtract the KL from the token rewards; GRPO and DAPO add it to the loss."""
    return cfg.algorithm.name in KL_IN_REWARD and cfg.algorithm.kl_coef > 0


def kl_in_loss(cfg: Config) -> bool:
    return cfg.algorithm.name in ("grpo", "dapo") and cfg.algorithm.kl_coef > 0


def advantage_inputs(cfg: Config) -> list[str]:
    """Columns the advantage state reads."""
    cols = ["rewards", "response_mask"]
    if uses_critic(cfg):
        cols.append("values")
    if kl_in_reward(cfg):
        cols += ["old_log_prob", "ref_log_prob"]
    return cols


SNAPSHOT_CONSUMER = "snapshot"  # reads what generation wrote ahead into a checkpoint (disaggregated, max_staleness > 0)


def generated_columns(cfg: Config) -> list[str]:
    """What generation writes into the dock (``workers.rollout.dock_columns``)."""
    cols = list(ROLLOUT_COLUMNS)
    if cfg.train.tis_cap is not None:
        cols.append("rollout_log_prob")
    if cfg.train.old_log_prob == "rollout":
        cols.append("old_log_prob")
    return cols


def consumers(cfg: Config) -> dict[str, list[str]]:
    """Consumer name -> columns it reads, for this config."""
    if cfg.algorithm.name == "dpo":
        return {"ref_infer": list(_FORWARD), "actor_update": [*_FORWARD, "response_mask", "ref_log_prob"]}
    # Under dynamic sampling only the groups that got advantages are scored and trained on.
    infer = [*_FORWARD, "advantages"] if cfg.rounds > 1 else list(_FORWARD)
    out = {"reward": ["responses", "response_mask"], "advantage": advantage_inputs(cfg)}
    if cfg.train.old_log_prob == "recompute":  # else generation writes old_log_prob itself
        out["actor_infer"] = list(infer)
    if uses_reference(cfg):
        out["ref_infer"] = list(infer)
    if uses_critic(cfg):
        out["critic_infer"] = list(_FORWARD)
        out["critic_update"] = [*_FORWARD, "response_mask", "values", "returns"]
    update = [*_FORWARD, "response_mask", "old_log_prob", "advantages"]
    if kl_in_loss(cfg):
        update.append("ref_log_prob")
    if cfg.train.tis_cap is not None:
        update.append("rollout_log_prob")
    out["actor_update"] = update
    if cfg.placement.mode == "disaggregated" and cfg.train.max_staleness > 0:
        out[SNAPSHOT_CONSUMER] = generated_columns(cfg)
    return out


def create_run_dock(cfg: Config, namespace: str) -> TransferDock:
    """The run's transfer dock with this config's schema, every consumer registered (both drivers use it)."""
    from dockflow.dock import DockSpec, create_dock

    dock = create_dock(DockSpec(
        columns=COLUMNS, capacity=cfg.dock_capacity, group_size=cfg.rollout.group_size, backend=cfg.dock.backend,
        num_warehouses=cfg.dock.num_warehouses, name=f"{cfg.run.name}-dock", namespace=namespace,
        get_timeout_s=cfg.dock.get_timeout_s,
    ))
    try:
        for consumer, cols in consumers(cfg).items():
            dock.register_consumer(consumer, cols)
    except BaseException:
        dock.shutdown()
        raise
    return dock
