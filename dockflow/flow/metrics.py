"""One iteration's metrics from the workers' results: merged generations, rollout summary, Eq. (5)."""

from __future__ import annotations

from dockflow.engines.sync_check import SYNC_CHECK
from dockflow.flow.throughput import throughput_tps


def merge_results(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """The stages' metrics as one flat dict (later parts win on a shared key)."""
    metrics: dict[str, float] = {}
    for part in results.values():
        metrics.update(part)
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
    loads = [p["timing/load_weights_s"] for p in parts if "timing/load_weights_s" in p]
    if loads:  # generators that took a newly published policy first
        merged["timing/load_weights_s"] = max(loads)
    merged.update(worst_sync_check(parts))
    for key in ("rollout/prompt_length", "rollout/response_length", "rollout/clipped_ratio"):
        if all(key in p for p in parts):
            merged[key] = sum(p[key] * p["rollout/samples"] for p in parts) / samples
    versions = [p["rollout/policy_version"] for p in parts if "rollout/policy_version" in p]
    if versions:
        merged["rollout/policy_version"] = min(versions)
    merged.update(merge_flow_counts(parts))
    merged.update(tool_means(parts))
    return merged


def worst_sync_check(parts: list[dict[str, float]]) -> dict[str, float]:
    """The largest sync-check difference of the generators that took (and checked) new weights, if any did."""
    diffs = [p[SYNC_CHECK] for p in parts if SYNC_CHECK in p]
    return {SYNC_CHECK: max(diffs)} if diffs else {}


def tool_means(parts: list[dict[str, float]]) -> dict[str, float]:
    """The per-trajectory ``tools/`` means of generators or rounds (runs with tools), weighted by their samples
    (an environment's reward: over the parts that report it)."""
    out: dict[str, float] = {}
    keys = dict.fromkeys(k for p in parts for k in p if k.startswith("tools/"))
    for key in keys:
        having = [p for p in parts if key in p]
        weight = sum(p["rollout/samples"] for p in having)
        out[key] = sum(p[key] * p["rollout/samples"] for p in having) / weight if weight else 0.0
    return out


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
    if all("rollout/clipped_ratio" in r for r in rounds):
        out["rollout/clipped_ratio"] = sum(r["rollout/clipped_ratio"] for r in rounds) / n
    versions = [r["rollout/policy_version"] for r in rounds if "rollout/policy_version" in r]
    if versions:
        out["rollout/policy_version"] = min(versions)
    loads = [r["timing/load_weights_s"] for r in rounds if "timing/load_weights_s" in r]
    if loads:
        out["timing/load_weights_s"] = sum(loads)
    out.update(worst_sync_check(rounds))
    out.update(merge_flow_counts(rounds))
    out.update(tool_means(rounds))
    return out
