"""The dock's column schema for GRPO and which worker state reads which columns.

Each consumer is one worker state (the paper's controllers, one per state). A worker reads exactly the
columns listed here from the dock and writes its output columns back.
"""

from __future__ import annotations

import torch

from dockflow.config import Config

COLUMNS: dict[str, torch.dtype] = {
    "input_ids": torch.long,
    "attention_mask": torch.long,
    "responses": torch.long,
    "response_mask": torch.long,
    "rewards": torch.float32,
    "advantages": torch.float32,
    "old_log_prob": torch.float32,
    "ref_log_prob": torch.float32,
}

ROLLOUT_COLUMNS = ("input_ids", "attention_mask", "responses", "response_mask")


def consumers(cfg: Config) -> dict[str, list[str]]:
    """Consumer name -> columns it reads, for this config."""
    update = ["input_ids", "attention_mask", "responses", "response_mask", "old_log_prob", "advantages"]
    out = {
        "reward": ["responses", "response_mask"],
        "advantage": ["rewards"],
        "actor_infer": ["input_ids", "attention_mask", "responses"],
    }
    if cfg.algorithm.kl_coef > 0:
        out["ref_infer"] = ["input_ids", "attention_mask", "responses"]
        update.append("ref_log_prob")
    out["actor_update"] = update
    return out
