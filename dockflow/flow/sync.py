"""The synchronous (on-policy) scheduler: one iteration = generate -> score/infer -> update -> reshard.

All stages of an iteration are launched at once; the dock's readiness and Ray's per-actor call order
give the dependencies, so scoring and inference stream behind generation with no stage barrier. Under
DAPO's dynamic sampling, generation and scoring run in rounds first (each round's count of informative
groups decides whether another is needed), then inference and the update follow.
"""

from __future__ import annotations

import time

from dockflow.config import Config
from dockflow.dock import TransferDock
from dockflow.flow import stages
from dockflow.flow.sampler import PromptSampler
from dockflow.flow.throughput import throughput_tps
from dockflow.flow.waiting import wait_stages
from dockflow.workers import Workers


def merge_results(results: dict[str, dict[str, float]]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for part in results.values():
        metrics.update(part)
    return metrics


def _sampling_rounds(
    cfg: Config, workers: Workers, prompt_ids: list[int], iteration: int
) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Generate and score rounds of G prompts until G informative groups have advantages (or the last round
    fills the batch). Returns the last round's scoring metrics and every round's generation metrics."""
    g = cfg.rollout.prompts_per_iter
    generated: list[dict[str, float]] = []
    scored: dict[str, float] = {}
    for r in range(cfg.rounds):
        last = r == cfg.rounds - 1
        refs = stages.generate(
            workers, iteration, prompt_ids[r * g : (r + 1) * g], first_index=r * cfg.global_batch,
            group_size=cfg.rollout.group_size,
        )
        refs.update(stages.score(workers, iteration, r, last))
        res = wait_stages(refs, cfg.train.stage_timeout_s, iteration)
        generated.append(pop_generated(res))
        scored = merge_results(res)
        if scored["dapo/kept_groups"] >= g:
            break
    scored["dapo/rounds"] = float(len(generated))
    return scored, generated


def generate_and_score(cfg: Config, workers: Workers, prompt_ids: list[int], iteration: int) -> dict[str, float]:
    """Generation and scoring of one iteration, waited for: the KFP pipeline's generate task (its infer and
    update tasks follow as separate steps). Returns the rollout and reward metrics."""
    if cfg.rounds > 1:
        metrics, generated = _sampling_rounds(cfg, workers, prompt_ids, iteration)
    else:
        refs = stages.generate(
            workers, iteration, prompt_ids, offline=cfg.algorithm.name == "dpo", group_size=cfg.rollout.group_size
        )
        refs.update(stages.score(workers, iteration))
        results = wait_stages(refs, cfg.train.stage_timeout_s, iteration)
        generated = [pop_generated(results)]
        metrics = merge_results(results)
    metrics.update(rollout_summary(generated, cfg.global_batch))
    return metrics


def run_iteration(
    cfg: Config, workers: Workers, dock: TransferDock, sampler: PromptSampler, iteration: int, devices: float
) -> dict[str, float]:
    """Run one on-policy iteration; returns its metrics (scalars only)."""
    dock.reset(window=cfg.dock_window(iteration))
    start = time.perf_counter()
    offline = cfg.algorithm.name == "dpo"
    prompt_ids = sampler.indices(iteration)
    metrics: dict[str, float] = {}
    generated: list[dict[str, float]] = []
    refs = {}
    if cfg.rounds > 1:
        metrics, generated = _sampling_rounds(cfg, workers, prompt_ids, iteration)
    else:
        refs.update(stages.generate(workers, iteration, prompt_ids, offline=offline, group_size=cfg.rollout.group_size))
        refs.update(stages.score(workers, iteration))
    refs.update(stages.infer(workers, iteration, offline=offline))
    refs.update(stages.update(workers, iteration))
    refs.update(stages.reshard(workers, iteration))
    results = wait_stages(refs, cfg.train.stage_timeout_s, iteration)
    if any(is_generation(k) for k in results):
        generated.append(pop_generated(results))
    seconds = time.perf_counter() - start
    metrics.update(merge_results(results))
    metrics.update(rollout_summary(generated, cfg.global_batch))
    metrics["timing/iteration_s"] = seconds
    metrics["perf/throughput_tps"] = iteration_throughput(metrics, devices, seconds)
    return metrics


def iteration_throughput(metrics: dict[str, float], devices: float, seconds: float) -> float:
    """Eq. (5) of an iteration from its rollout metrics and end-to-end seconds."""
    return throughput_tps(
        int(metrics["rollout/samples"]), metrics["rollout/prompt_length"], metrics["rollout/response_length"],
        devices, seconds,
    )


def is_generation(stage: str) -> bool:
    return stage == "generate" or stage.startswith("generate/")


def pop_generated(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """Remove the generation results (one, or one per generator worker) and merge them into one round:
    sample-weighted mean lengths, summed samples and tokens, the slowest generator's seconds."""
    parts = [results.pop(k) for k in sorted(results) if is_generation(k)]
    samples = sum(p["rollout/samples"] for p in parts)
    merged = {
        "rollout/samples": samples,
        "rollout/tokens": sum(p["rollout/tokens"] for p in parts),
        "timing/generate_s": max(p["timing/generate_s"] for p in parts),
        "timing/generate_busy_s": sum(p["timing/generate_s"] for p in parts),
    }
    for key in ("rollout/prompt_length", "rollout/response_length"):
        merged[key] = sum(p[key] * p["rollout/samples"] for p in parts) / samples
    versions = [p["rollout/policy_version"] for p in parts if "rollout/policy_version" in p]
    if versions:
        merged["rollout/policy_version"] = min(versions)
    merged.update(merge_flow_counts(parts))
    return merged


def merge_flow_counts(parts: list[dict[str, float]]) -> dict[str, float]:
    """The generators' ``flow/`` counters (chunks taken, groups parked and resumed): summed, except the
    queue-wide ``*_total`` ones, which every generator reports alike (the largest is the latest)."""
    out: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            if key.startswith("flow/"):
                out[key] = max(out.get(key, value), value) if key.endswith("_total") else out.get(key, 0.0) + value
    return out


def rollout_summary(rounds: list[dict[str, float]], round_samples: int) -> dict[str, float]:
    """Generation metrics over rounds of equal size: mean lengths, total samples, tokens and seconds."""
    n = len(rounds)
    out = {
        "rollout/samples": float(round_samples * n),
        "rollout/prompt_length": sum(r["rollout/prompt_length"] for r in rounds) / n,
        "rollout/response_length": sum(r["rollout/response_length"] for r in rounds) / n,
        "rollout/tokens": sum(r["rollout/tokens"] for r in rounds),
        "timing/generate_s": sum(r["timing/generate_s"] for r in rounds),
        "timing/generate_busy_s": sum(r.get("timing/generate_busy_s", r["timing/generate_s"]) for r in rounds),
    }
    versions = [r["rollout/policy_version"] for r in rounds if "rollout/policy_version" in r]
    if versions:
        out["rollout/policy_version"] = min(versions)
    out.update(merge_flow_counts(rounds))
    return out
