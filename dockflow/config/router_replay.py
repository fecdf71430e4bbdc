"""Routing replay's config rules: whether generation records each token's experts (``routed_experts``), and the
settings ``train.router_replay: replay`` cannot run with (``docs/engines.md``, Routing replay)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dockflow.config.run import Config


def moe_policy(cfg: Config) -> bool | None:
    """Whether the policy is a mixture of experts: the tiny model's architecture; None for ``model.path`` (known
    once the workers load it)."""
    return None if cfg.model.path else cfg.model.tiny.architecture == "qwen3_moe"


def records_routing(cfg: Config) -> bool:
    """Whether generation puts ``routed_experts`` into the dock (the run plan's column): an MoE policy (or replay
    asked for), sampled single-turn on the HF engine, whole (no partial rollout)."""
    moe = cfg.train.router_replay == "replay" or bool(moe_policy(cfg))
    single_turn = not cfg.tools.enabled and cfg.rollout.partial.token_budget is None
    return moe and not cfg.offline and cfg.engine.backend == "hf" and single_turn


def check_router_replay(cfg: Config) -> None:
    """One line for a ``train.router_replay: replay`` that cannot run."""
    if cfg.train.router_replay != "replay":
        return
    refused = {
        f"model.tiny.architecture={cfg.model.tiny.architecture} is dense (no router to replay; set it to qwen3_moe, or train.router_replay: off)":
            moe_policy(cfg) is False,
        f"algorithm.name={cfg.algorithm.name} trains on offline pairs (nothing generated, no routing recorded)":
            cfg.offline,
        "engine.backend=vllm: vLLM's CPU build cannot return routed experts (its AuxOutput connector needs Model "
        "Runner V2, which needs Triton); use engine.backend: hf":
            cfg.engine.backend == "vllm",
        "engine.backend=cost_model (it samples no model; use engine.backend: hf)": cfg.engine.backend == "cost_model",
        "tools (multi-turn rollouts record no routing yet; set train.router_replay: off)": cfg.tools.enabled,
        "rollout.partial.token_budget (continued rows record no routing yet; set it to null)":
            cfg.rollout.partial.token_budget is not None,
    }
    for why, bad in refused.items():
        if bad:
            raise ValueError(f"train.router_replay=replay with {why}")
