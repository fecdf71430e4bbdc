"""Generation into the dock: the rollout step the actor worker (colocated) and the generator workers
(disaggregated) share. Each chunk of prompts is sampled, tagged with the policy version that produced it,
and put into the iteration's dock window as soon as it is done, so scoring streams right behind it."""

from __future__ import annotations

import time

import torch
from tensordict import TensorDict

from dockflow.config import Config
from dockflow.config.router_replay import records_routing
from dockflow.dock import TransferDock
from dockflow.engines import GenerationEngine, SamplingParams
from dockflow.rollout.prompts import PromptTable
from dockflow.rollout.queue import QueueClient, QueueSettings, RolloutQueue


def generation_seed(run_seed: int, iteration: int) -> int:
    """Sampling seed of one iteration: a resumed run draws the same responses as an uninterrupted one."""
    return (run_seed * 1_000_003 + iteration) % 2**62


def dock_columns(cfg: Config, out: TensorDict) -> TensorDict:
    """What generation puts into the dock: the rollout and the engine's log-probs as ``rollout_log_prob`` (the
    rollout correction and the rollout-vs-trainer drift metric read them), also as ``old_log_prob`` when
    ``train.old_log_prob: rollout`` (then no actor pass recomputes them); with tools, each trajectory's
    ``tool_record`` (its conversation and environment, for the reward functions); an MoE policy's
    ``routed_experts`` where the run plan has them (``records_routing``)."""
    cols = out.select("input_ids", "attention_mask", "responses", "response_mask")
    cols["rollout_log_prob"] = out["rollout_log_prob"]
    if cfg.train.old_log_prob == "rollout":
        cols["old_log_prob"] = out["rollout_log_prob"]
    if "tool_record" in out.keys():
        cols["tool_record"] = out["tool_record"]
    if records_routing(cfg):
        cols["routed_experts"] = out["routed_experts"]
    return cols


def clipped_rows(out: TensorDict) -> int:
    """Responses that filled their whole width (``rollout.max_new_tokens``; a tool trajectory's token budget):
    cut at the limit, not ended by the model."""
    return int((out["response_length"] >= out["responses"].shape[1]).sum())


def rollout_metrics(prompt_tokens: int, response_tokens: int, samples: int, start: float,
                    clipped: int) -> dict[str, float]:
    """What a generation round reports: its time and mean token lengths (for Eq. 5 throughput), and the share of
    responses cut at the length limit (``rollout/clipped_ratio``, from :func:`clipped_rows`)."""
    out = {
        "timing/generate_s": time.perf_counter() - start,
        "rollout/samples": float(samples),
        "rollout/prompt_length": prompt_tokens / samples,
        "rollout/response_length": response_tokens / samples,
        "rollout/tokens": float(prompt_tokens + response_tokens),
    }
    out["rollout/clipped_ratio"] = clipped / samples
    return out


def generate_into_dock(
    cfg: Config,
    engine: GenerationEngine,
    dock: TransferDock,
    table: PromptTable,
    *,
    iteration: int,
    prompt_ids: list[int],
    first_index: int,
    policy_version: int,
    queue: QueueClient | None = None,
    rank: int = 0,
    window_start: int,
) -> dict[str, float]:
    """Sample N responses for each of ``prompt_ids`` and stream them into the dock, chunk by chunk, from
    index ``first_index`` of ``iteration``'s window (which starts at dock index ``window_start``: the plan's
    ``dock_window(iteration)[0]``) on. Chunks come from ``queue`` (shared by several
    generators, already opened for the iteration; None: a private one): chunk k always holds the same prompts,
    seed and dock slice, whoever takes it."""
    start = time.perf_counter()
    ro = cfg.rollout
    if queue is None:
        own = RolloutQueue(QueueSettings(max(1, ro.batch_size // ro.group_size)))
        own.open(iteration, prompt_ids)
        queue = QueueClient(own)
    prompts = [table.templated[i] for i in prompt_ids]
    params = SamplingParams(ro.max_new_tokens, ro.temperature, ro.top_p, greedy=False, n=ro.group_size)
    seed = generation_seed(cfg.run.seed, iteration) + first_index
    prompt_tokens = response_tokens = samples = chunks = clipped = 0
    while (work := queue.take(iteration, rank)) is not None:
        c, count = work.offset, len(work.prompt_ids)
        out = engine.generate(prompts[c : c + count], params, seed + c, prompt_width=table.width)
        first = window_start + first_index + work.slot * ro.group_size
        indices = list(range(first, first + out.batch_size[0]))
        meta = {
            "prompt_id": torch.tensor(work.prompt_ids).repeat_interleave(ro.group_size),
            "response_length": out["response_length"],
            "policy_version": torch.full((len(indices),), policy_version),
        }
        dock.put(indices, dock_columns(cfg, out), meta)
        prompt_tokens += int(out["prompt_length"].sum())
        response_tokens += int(out["response_length"].sum())
        clipped += clipped_rows(out)
        samples += len(indices)
        chunks += 1
    out = rollout_metrics(prompt_tokens, response_tokens, max(samples, 1), start, clipped)
    out["rollout/samples"] = float(samples)
    out[f"flow/chunks_generator_{rank}"] = float(chunks)
    return out
