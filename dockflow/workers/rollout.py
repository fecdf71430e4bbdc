"""Generation into the dock: the rollout step the actor worker (colocated) and the generator workers
(disaggregated) share. Each chunk of prompts is sampled, tagged with the policy version that produced it,
and put into the iteration's dock window as soon as it is done, so scoring streams right behind it."""

from __future__ import annotations

import time
from typing import Any

import torch
from tensordict import TensorDict

from dockflow.config import Config
from dockflow.dock import TransferDock
from dockflow.engines import GenerationEngine, SamplingParams
from dockflow.workers.rollout_queue import RolloutQueue

_RUN_WIDTH: tuple[list[str], int] | None = None


def run_prompt_width(engine: GenerationEngine, train_prompts: list[str]) -> int:
    """One prompt width for the whole run (computed once per prompt list): the dock fixes a column's per-sample
    shape until it is fully reset, so prompts of varying length must be padded alike in every iteration."""
    global _RUN_WIDTH
    if _RUN_WIDTH is None or _RUN_WIDTH[0] is not train_prompts:
        _RUN_WIDTH = (train_prompts, engine.prompt_width(train_prompts))
    return _RUN_WIDTH[1]


def generation_seed(run_seed: int, iteration: int) -> int:
    """Sampling seed of one iteration: a resumed run draws the same responses as an uninterrupted one."""
    return (run_seed * 1_000_003 + iteration) % 2**62


def dock_columns(cfg: Config, out: TensorDict) -> TensorDict:
    """What generation puts into the dock: the rollout and the engine's log-probs as ``rollout_log_prob`` (TIS
    and the rollout-vs-trainer drift metric read them), also as ``old_log_prob`` when ``train.old_log_prob:
    rollout`` (then no actor pass recomputes them)."""
    cols = out.select("input_ids", "attention_mask", "responses", "response_mask")
    cols["rollout_log_prob"] = out["rollout_log_prob"]
    if cfg.train.old_log_prob == "rollout":
        cols["old_log_prob"] = out["rollout_log_prob"]
    return cols


def rollout_metrics(prompt_tokens: int, response_tokens: int, samples: int, start: float) -> dict[str, float]:
    """What a generation round reports: its time and mean token lengths (for Eq. 5 throughput)."""
    return {
        "timing/generate_s": time.perf_counter() - start,
        "rollout/samples": float(samples),
        "rollout/prompt_length": prompt_tokens / samples,
        "rollout/response_length": response_tokens / samples,
        "rollout/tokens": float(prompt_tokens + response_tokens),
    }


class RolloutQueueTimeout(RuntimeError):
    """The generators' shared rollout queue did not answer in time."""


def queue_call(queue: Any, method: str, *args: Any, timeout_s: float = 60.0) -> Any:
    """Call ``method`` on a local :class:`RolloutQueue` or on its Ray actor, waiting at most ``timeout_s``."""
    fn = getattr(queue, method)
    if not hasattr(fn, "remote"):
        return fn(*args)
    import ray

    try:
        return ray.get(fn.remote(*args), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        which = f" for iteration {args[0]}" if args and isinstance(args[0], int) else ""
        raise RolloutQueueTimeout(
            f"the rollout queue actor did not answer '{method}'{which} within {timeout_s:.0f}s "
            "(train.stage_timeout_s); is the '<run>-rollout-queue' actor alive?"
        ) from None


def generate_into_dock(
    cfg: Config,
    engine: GenerationEngine,
    dock: TransferDock,
    train_prompts: list[str],
    iteration: int,
    prompt_ids: list[int],
    first_index: int,
    policy_version: int,
    queue: Any = None,
    rank: int = 0,
) -> dict[str, float]:
    """Sample N responses for each of ``prompt_ids`` and stream them into the dock, chunk by chunk, from
    index ``first_index`` of ``iteration``'s window on. Chunks come from ``queue`` (shared by several
    generators, already opened for the iteration; None: a private one): chunk k always holds the same prompts,
    seed and dock slice, whoever takes it."""
    start = time.perf_counter()
    ro = cfg.rollout
    per_chunk = max(1, ro.batch_size // ro.group_size)
    if queue is None:
        queue = RolloutQueue(per_chunk)
        queue.open(iteration, prompt_ids)
    prompts = [train_prompts[i] for i in prompt_ids]  # formatted (PromptFormat) by the worker
    width = run_prompt_width(engine, train_prompts)
    params = SamplingParams(ro.max_new_tokens, ro.temperature, ro.top_p, greedy=False, n=ro.group_size)
    seed = generation_seed(cfg.run.seed, iteration) + first_index
    prompt_tokens = response_tokens = samples = chunks = 0
    while (work := queue_call(queue, "take", iteration, rank, timeout_s=cfg.train.stage_timeout_s)) is not None:
        c, count = work.offset, len(work.prompt_ids)
        out = engine.generate(prompts[c : c + count], params, seed + c, prompt_width=width)
        first = cfg.dock_window(iteration)[0] + first_index + work.slot * ro.group_size
        indices = list(range(first, first + out.batch_size[0]))
        meta = {
            "prompt_id": torch.tensor(work.prompt_ids).repeat_interleave(ro.group_size),
            "response_length": out["response_length"],
            "policy_version": torch.full((len(indices),), policy_version),
        }
        dock.put(indices, dock_columns(cfg, out), meta)
        prompt_tokens += int(out["prompt_length"].sum())
        response_tokens += int(out["response_length"].sum())
        samples += len(indices)
        chunks += 1
    out = rollout_metrics(prompt_tokens, response_tokens, max(samples, 1), start)
    out["rollout/samples"] = float(samples)
    out[f"flow/chunks_generator_{rank}"] = float(chunks)
    return out
