"""Generation into the dock: the rollout step the actor worker (colocated) and the generator workers
(disaggregated) share. Each chunk of prompts is sampled, tagged with the policy version that produced it,
and put into the iteration's dock window as soon as it is done, so scoring streams right behind it."""

from __future__ import annotations

import time

import torch

from dockflow.config import Config
from dockflow.data import apply_template
from dockflow.dock import TransferDock
from dockflow.engines import GenerationEngine, SamplingParams


def generation_seed(run_seed: int, iteration: int) -> int:
    """Sampling seed of one iteration: a resumed run draws the same responses as an uninterrupted one."""
    return (run_seed * 1_000_003 + iteration) % 2**62


def rollout_metrics(prompt_tokens: int, response_tokens: int, samples: int, start: float) -> dict[str, float]:
    """What a generation round reports: its time and mean token lengths (for Eq. 5 throughput)."""
    return {
        "timing/generate_s": time.perf_counter() - start,
        "rollout/samples": float(samples),
        "rollout/prompt_length": prompt_tokens / samples,
        "rollout/response_length": response_tokens / samples,
        "rollout/tokens": float(prompt_tokens + response_tokens),
    }


def generate_into_dock(
    cfg: Config,
    engine: GenerationEngine,
    dock: TransferDock,
    train_prompts: list,
    iteration: int,
    prompt_ids: list[int],
    first_index: int,
    policy_version: int,
) -> dict[str, float]:
    """Sample N responses for each of ``prompt_ids`` and stream them into the dock, chunk by chunk, from
    index ``first_index`` of ``iteration``'s window on."""
    start = time.perf_counter()
    ro = cfg.rollout
    prompts = [apply_template(cfg.data.prompt_template, train_prompts[i].prompt) for i in prompt_ids]
    width = engine.prompt_width(prompts)
    params = SamplingParams(ro.max_new_tokens, ro.temperature, ro.top_p, greedy=False, n=ro.group_size)
    per_chunk = max(1, ro.batch_size // ro.group_size)
    seed = generation_seed(cfg.run.seed, iteration) + first_index
    prompt_tokens = response_tokens = 0
    for c in range(0, len(prompts), per_chunk):
        out = engine.generate(prompts[c : c + per_chunk], params, seed + c, prompt_width=width)
        first = cfg.dock_window(iteration)[0] + first_index + c * ro.group_size
        indices = list(range(first, first + out.batch_size[0]))
        meta = {
            "prompt_id": torch.tensor(prompt_ids[c : c + per_chunk]).repeat_interleave(ro.group_size),
            "response_length": out["response_length"],
            "policy_version": torch.full((len(indices),), policy_version),
        }
        dock.put(indices, out.select("input_ids", "attention_mask", "responses", "response_mask"), meta)
        prompt_tokens += int(out["prompt_length"].sum())
        response_tokens += int(out["response_length"].sum())
    return rollout_metrics(prompt_tokens, response_tokens, len(prompts) * ro.group_size, start)
