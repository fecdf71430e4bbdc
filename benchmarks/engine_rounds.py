"""A setup's generation and training engines in this process, and one round of each: what the engine-level
benchmarks (``idle_processes``, ``host_memory``) time, outside Ray.

A round ``k`` samples the setup's prompts of iteration ``k`` (G prompts x N samples) and takes one GRPO step on the
rollouts with random per-group advantages (seeded by ``k``), as an actor worker does with the dock's columns.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from dockflow.algos import recipe_of
from dockflow.config import Config


class Engines:
    """The engines of ``cfg`` over ``model``, the run's train prompts and its sampling parameters."""

    def __init__(self, cfg: Config, model: Any, tokenizer: Any, threads: int) -> None:
        from dockflow.data.arithmetic import generate_arithmetic
        from dockflow.data.templates import PromptFormat
        from dockflow.engines import EngineInputs, SamplingParams, create_engines

        self.cfg = cfg
        inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed, cfg.model.lora)
        self.train, self.gen = create_engines(inputs, model, tokenizer, device="cpu", cpus=threads)
        task = generate_arithmetic(cfg.data.arithmetic, cfg.run.seed)
        self.prompts = PromptFormat.of(cfg.data).render_all([ex.prompt for ex in task.train], tokenizer)
        ro = cfg.rollout
        self.params = SamplingParams(ro.max_new_tokens, ro.temperature, ro.top_p, greedy=False, n=ro.group_size)
        self.width = self.gen.prompt_width(self.prompts[:1024])

    def generate(self, k: int) -> TensorDict:
        """Round ``k``'s rollouts in the dock's columns."""
        from dockflow.rollout.plain import dock_columns

        g = self.cfg.rollout.prompts_per_iter
        out = self.gen.generate(self.prompts[k * g:(k + 1) * g], self.params, seed=k, prompt_width=self.width)
        return dock_columns(self.cfg, out)

    def update(self, k: int, batch: TensorDict) -> None:
        """One GRPO step on ``batch`` (one mini-batch) with round ``k``'s random advantages."""
        cfg, n = self.cfg, self.cfg.rollout.group_size
        rows, width = batch["responses"].shape
        advantages = torch.randn(rows // n, generator=torch.Generator().manual_seed(k))
        batch["advantages"] = advantages.repeat_interleave(n)[:, None].expand(rows, width) * batch["response_mask"]
        self.train.train_mini_batch(batch, lambda logp, mb, tokens: recipe_of(cfg.algorithm.name).policy_loss(cfg, logp, mb, tokens),
                                    rows)


def tiny_model(cfg: Config) -> tuple[Any, Any]:
    """The config's tiny model (random weights) and task tokenizer."""
    from dockflow.models import build_tiny_model
    from dockflow.models.tokenizer import build_task_tokenizer

    tokenizer = build_task_tokenizer(cfg.data, cfg.run.seed, cfg.model.tiny.tokenizer_merges, cfg.checkpoint)
    return build_tiny_model(cfg.model.tiny, tokenizer, seed=cfg.run.seed), tokenizer
