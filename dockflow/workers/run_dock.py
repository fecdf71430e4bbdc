"""The dock's column schema and the run's dock, with the run plan's consumers registered.

Each consumer is one worker state (the paper's controllers, one per state); which states a run has and which
columns each reads is the run plan's (``RunPlan.consumers()``: each role's ``reads``, from the algorithm's
recipe, ``dockflow.algos.base.Algorithm.consumers``, plus the reward-model and snapshot states):

    state          writes                         algorithms
    reward_model   rm_scores                      all that sample, with reward.models
    reward         rewards                        all that sample (not DPO); with tools: reads tool_record
    advantage      advantages (+ returns)         all that sample
    actor_infer    old_log_prob                   all that sample (unless train.old_log_prob: rollout)
    ref_infer      ref_log_prob                   DPO, or any with algorithm.kl_coef > 0
    critic_infer   values                         PPO, PF-PPO
    actor_update   (the policy)                   all
    critic_update  (the critic)                   PPO, PF-PPO
    snapshot       (a checkpoint's in-flight part) disaggregated, with train.max_staleness > 0
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dockflow.algos.plan import RunPlan
from dockflow.config import Config

if TYPE_CHECKING:
    from dockflow.dock import TransferDock

COLUMNS: dict[str, torch.dtype] = {
    "input_ids": torch.long,
    "attention_mask": torch.long,
    "responses": torch.long,
    "response_mask": torch.long,
    "rewards": torch.float32,
    "rm_scores": torch.float32,  # [B, M]: each reward model's raw score, M in the order of reward.models
    "advantages": torch.float32,  # [B, R]: per token (sequence-level estimators broadcast over the response)
    "returns": torch.float32,  # [B, R]: the critic's regression target
    "values": torch.float32,  # [B, R]: the critic's value before each response token
    "old_log_prob": torch.float32,
    "ref_log_prob": torch.float32,
    "rollout_log_prob": torch.float32,  # [B, R]: the generating engine's log-probs (the behaviour policy)
    "tool_record": torch.uint8,  # [B, tools.record_bytes]: a tool trajectory's conversation and environment
    "routed_experts": torch.int16,  # [B, P+R, L, K]: an MoE policy's experts per token, -1 not recorded
}

ROLLOUT_COLUMNS = ("input_ids", "attention_mask", "responses", "response_mask")


def run_dock_name(cfg: Config) -> str:
    """The run's dock: its actors are named ``<run>-dock/...`` (a dock process per node, or the central buffer)."""
    return f"{cfg.run.name}-dock"


def create_run_dock(cfg: Config, plan: RunPlan, namespace: str) -> TransferDock:
    """The run's transfer dock with this config's schema, sized and with every consumer of the run ``plan``
    registered (both drivers use it)."""
    from dockflow.dock import DockSpec, create_dock

    dock = create_dock(DockSpec(
        columns=COLUMNS, capacity=plan.dock_capacity, group_size=cfg.rollout.group_size, backend=cfg.dock.backend,
        num_warehouses=cfg.dock.num_warehouses, name=run_dock_name(cfg), namespace=namespace,
        get_timeout_s=cfg.dock.get_timeout_s,
    ))
    try:
        for consumer, cols in plan.consumers().items():
            dock.register_consumer(consumer, cols)
    except BaseException:
        dock.shutdown()
        raise
    return dock
