"""DockFlow vs TRL's GRPOTrainer, side by side in one run: Eq. (5) throughput and held-out accuracy before/after.

Both systems train the same model from the same weights on the same prompts (DockFlow's per-iteration prompt
order), with the same G, N, max new tokens (SL), learning rate, clip, KL coefficient (0), temperature, batch
layout and iteration count, on the same CPU cores; both are evaluated with DockFlow's greedy test-split
accuracy. Two setups:

- ``tiny``: the demo (configs/grpo_arith.yaml): the SFT-warm-started tiny Qwen2 (1.0M parameters),
  2-digit arithmetic, the verifier reward; G=32, N=8, SL=8.
- ``larger``: a 25M-parameter Qwen2 built locally from a transformers ``Qwen2Config`` (hidden 512, 8 layers),
  fresh weights, G=8, N=4, SL=256 at most: the task tokenizer's EOS ends a response (``build_larger_model``).

DockFlow runs through ``dockflow.flow.trainer.train`` (Ray, transfer dock, workers) under each schedule of
``--modes`` (``benchmarks/modes.py``: ``sync`` colocated on 2 CPUs; ``async`` a generator and the actor on 1 CPU
each, ``max_staleness`` 1), with ``train.old_log_prob: rollout``; TRL (PyPI ``trl``, the ``bench`` extra)
through ``benchmarks/trl_grpo.py``. Throughput of each iteration is
G x N x (PL + SL) / ND / seconds (``dockflow.flow.throughput``), PL and SL the mean prompt and response tokens
actually generated, ND the 2 cores both use; ``tps`` is its mean over iterations.

    python -m benchmarks.vs_trl --out runs/bench_vs_trl.json [--setups tiny,larger] [--modes sync,async]
        [--tiny-iterations 60] [--larger-iterations 5] [--pairs 3] [section.key=value ...]

With ``--setups`` naming a subset, the other setups' records already in ``--out`` are kept. A ``model.lora=...``
override trains LoRA adapters in both systems (TRL: ``GRPOTrainer(peft_config=...)`` with the same rank, alpha,
dropout and targets, ``trl_grpo.peft_config``).

Prints a table and writes ``{"machine": ..., "results": [...], "comparison": [...]}``: one record per system
and setup (``system``, ``setup``, ``tps``, ``accuracy_before``, ``accuracy_after``, ``iterations``, ``wall_s``,
per-phase seconds, ``mode``, ``pair``, ...), and per setup and DockFlow mode the DockFlow/TRL throughput ratio
of each pair, their median, and the verdict against issue 30's targets (>= 1.0x; stretch 1.2x). ``--pairs N`` runs
each setup N times as alternating pairs (DockFlow first, then TRL first, ...), pair k with ``run.seed`` + k: the
accuracy gains compared (medians) are then those of N seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: every model and tokenizer is built here
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from benchmarks.cpu_load import CpuLoad, Snapshot  # noqa: E402
from benchmarks.modes import mode_overrides  # noqa: E402
from benchmarks.trl_grpo import IterationStats, run_trl  # noqa: E402
from benchmarks.vs_trl_report import print_table  # noqa: E402
from dockflow.config import Config, TinyModelConfig, load_config  # noqa: E402
from dockflow.flow.run_setup import run_dir_of  # noqa: E402
from dockflow.flow.sft import SFTInputs, sft_warm_start  # noqa: E402
from dockflow.flow.throughput import throughput_tps  # noqa: E402
from dockflow.flow.trainer import train  # noqa: E402
from dockflow.workers.resources import build_plan  # noqa: E402

CONFIG = "configs/grpo_arith.yaml"
TARGET_RATIO = 1.0  # issue 30: DockFlow's tokens/s at least TRL's in both setups (stretch: STRETCH_RATIO on one)
STRETCH_RATIO = 1.2
MODES = ("sync", "async")  # DockFlow's schedules (benchmarks/modes.py); TRL is synchronous
ASYNC_STALENESS = 1
LARGER_MODEL = TinyModelConfig(
    hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=1536, max_position_embeddings=512
)


@dataclass(frozen=True)
class Setup:
    """One comparison: config overrides on top of the demo config, and the default iteration count."""

    name: str
    overrides: tuple[str, ...]
    iterations: int


SETUPS = {
    "tiny": Setup("tiny", (), 60),
    "larger": Setup(
        "larger",
        (
            "sft.enabled=false",
            "rollout.prompts_per_iter=8",
            "rollout.group_size=4",
            "rollout.max_new_tokens=256",
            "rollout.batch_size=32",
            "train.mini_batch_size=32",
            "train.micro_batch_size=32",
            "train.infer_batch_size=32",
            "eval.num_prompts=32",  # 256 greedy tokens each: 4 evaluations cost about as much as the training
            "eval.batch_size=32",
        ),
        5,
    ),
}


def setup_config(setup: Setup, iterations: int, runs_dir: str, extra: list[str], mode: str = "sync") -> Config:
    """The DockFlow config of a setup and schedule (``benchmarks.modes``); TRL reads its settings from the
    ``sync`` one."""
    overrides = [
        f"run.name=vs_trl_{setup.name}_{mode}",
        f"run.output_dir={runs_dir}",
        f"train.iterations={iterations}",
        "eval.every=0",
        "checkpoint.every=0",
        # TRL skips the old-log-prob pass when it trains once per generation (its old log-probs are the detached
        # current ones); DockFlow takes the generator's own log-probs instead, which also holds when async.
        "train.old_log_prob=rollout",
        *setup.overrides,
        *(f"{k}={v}" for k, v in mode_overrides(mode, ASYNC_STALENESS).items()),
        *extra,
    ]
    if setup.name == "larger":
        overrides.append(f"model.path={Path(runs_dir) / 'larger_model'}")
    return load_config(CONFIG, overrides)


def build_larger_model(cfg: Config) -> tuple[str, int]:
    """The larger setup's initial policy at ``model.path``: a fresh 25M Qwen2 with the task tokenizer and its EOS
    (random weights: about one sampled token in the vocabulary's 128 ends a response, in both systems alike; an
    EOS past the vocabulary, which kept every response at ``rollout.max_new_tokens`` until 2026-11-27, is refused
    at start since: the tokenizer would not fit the model). Returns the directory and the parameter count."""
    from dockflow.models import build_tiny_model, save_pretrained_dir
    from dockflow.models.tokenizer import build_task_tokenizer

    tokenizer = build_task_tokenizer(cfg.data, cfg.run.seed, cfg.model.tiny.tokenizer_merges, cfg.checkpoint)
    model = build_tiny_model(LARGER_MODEL, tokenizer, seed=cfg.run.seed)  # vocabulary = the tokenizer's
    path = save_pretrained_dir(model, tokenizer, cfg.model.path)
    return str(path), sum(p.numel() for p in model.parameters())


def model_params(model_dir: str) -> int:
    from dockflow.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(model_dir)
    return sum(p.numel() for p in model.parameters())


def dockflow_iteration(metrics: dict[str, float]) -> IterationStats:
    """One DockFlow iteration from its metrics; phases are the seconds each worker measured (the reward worker's
    without its wait for the responses: scoring time, comparable with TRL's)."""
    phases = {
        name: metrics[f"timing/{key}_s"]
        for name, key in (("generate", "generate"), ("old_log_prob", "old_log_prob"), ("update", "update"),
                          ("reshard", "reshard"), ("reward", "reward"), ("advantage", "advantage"))
        if f"timing/{key}_s" in metrics
    }
    if "reward" in phases:  # the reward call starts as generation does and waits in the dock for its responses
        phases["reward"] -= metrics.get("timing/reward_wait_s", 0.0)
    return IterationStats(
        int(metrics["rollout/samples"]), metrics["rollout/prompt_length"], metrics["rollout/response_length"],
        metrics["timing/iteration_s"], metrics["reward/mean"], phases,
    )


# Phases on each system's critical path (DockFlow's reward and advantage stream on the reward worker while the
# actor generates; TRL scores after generating, in the same process).
SERIAL_PHASES = {"dockflow": ("generate", "old_log_prob", "update", "reshard"), "trl": ("generate", "score", "update")}


def summarize(
    system: str, setup: str, iterations: list[IterationStats], *, devices: float,
    accuracy_before: float, accuracy_after: float, wall_s: float, extra: dict[str, Any] | None = None,
    mode: str = "sync",
) -> dict[str, Any]:
    """The record of one run: Eq. (5) per iteration with the same formula for both systems, then means."""
    if not iterations:
        raise ValueError(f"{system}/{setup}: no iterations were measured")
    tps = [throughput_tps(s.samples, s.prompt_length, s.response_length, devices, s.seconds) for s in iterations]
    seconds = [s.seconds for s in iterations]
    phase_names = sorted({k for s in iterations for k in s.phases})
    phases = {k: statistics.fmean(s.phases.get(k, 0.0) for s in iterations) for k in phase_names}
    serial = SERIAL_PHASES.get(system, ())
    phases["other"] = statistics.fmean(seconds) - sum(phases.get(k, 0.0) for k in serial)
    return {
        "system": system,
        "setup": setup,
        "mode": mode,
        "iterations": len(iterations),
        "tps": statistics.fmean(tps),
        "tps_median": statistics.median(tps),
        "accuracy_before": accuracy_before,
        "accuracy_after": accuracy_after,
        "accuracy_gain": accuracy_after - accuracy_before,
        "wall_s": wall_s,
        "train_s": sum(seconds),
        "seconds_per_iteration": statistics.fmean(seconds),
        "samples_per_iteration": statistics.fmean(s.samples for s in iterations),
        "prompt_length": statistics.fmean(s.prompt_length for s in iterations),
        "response_length": statistics.fmean(s.response_length for s in iterations),
        "devices": devices,
        "phase_s": phases,
        "reward_per_iteration": [s.reward_mean for s in iterations],
        "tps_per_iteration": tps,
        **(extra or {}),
    }


def compare(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per setup and DockFlow schedule, against TRL on that setup: the throughput ratio of each pair (the
    DockFlow and TRL runs of one ``pair``, run back to back) and their median, the target, and the accuracy
    gains (medians over the pairs, and each system's gain at each pair's seed)."""
    out = []
    keys = sorted({(r["setup"], r.get("mode", "sync")) for r in results if r["system"] == "dockflow"})
    for setup, mode in keys:
        pairs = []
        for r in results:
            if r["system"] != "dockflow" or r["setup"] != setup or r.get("mode", "sync") != mode:
                continue
            trl = next((t for t in results if t["system"] == "trl" and t["setup"] == setup
                        and t.get("pair", 0) == r.get("pair", 0)), None)
            if trl is not None:
                pairs.append((r, trl))
        if not pairs:
            continue
        ratios = [r["tps"] / t["tps"] if t["tps"] else float("inf") for r, t in pairs]
        ratio = statistics.median(ratios)
        gain_df = statistics.median(r["accuracy_gain"] for r, _ in pairs)
        gain_trl = statistics.median(t["accuracy_gain"] for _, t in pairs)
        out.append({
            "setup": setup, "mode": mode, "pairs": len(pairs), "tps_ratios": ratios, "tps_ratio": ratio,
            "target_ratio": TARGET_RATIO, "throughput_target_met": ratio >= TARGET_RATIO,
            "stretch_ratio": STRETCH_RATIO, "stretch_met": ratio >= STRETCH_RATIO,
            "accuracy_gain_dockflow": gain_df, "accuracy_gain_trl": gain_trl,
            "accuracy_target_met": gain_df >= gain_trl,
            "gains_by_seed": [{"seed": r.get("seed"), "dockflow": r["accuracy_gain"], "trl": t["accuracy_gain"]}
                              for r, t in pairs],
        })
    return out


def marker(load: CpuLoad) -> tuple[list[Snapshot], Callable[[], None]]:
    """Marks of CPU use at the end of every iteration (the list, and the function that appends one)."""
    marks: list[Snapshot] = []
    return marks, lambda: marks.append(load.mark())


def cpu_record(load: CpuLoad, marks: list[Snapshot]) -> dict[str, Any]:
    """Other processes' busy cores over the whole run, and busy cores by process over iterations 2..n
    (from the end of the first iteration to the end of the last: start-up, warm-up and evaluation left out)."""
    window = CpuLoad.window(marks[0], marks[-1]) if len(marks) > 1 else None
    return {"foreign_cores": load.cores, "cpu_cores_iterations": window}


def run_dockflow(setup: Setup, mode: str, iterations: int, runs_dir: str, extra: list[str],
                 common: dict[str, Any]) -> dict[str, Any]:
    """One DockFlow run of a setup under one schedule; its record."""
    cfg = setup_config(setup, iterations, runs_dir, extra, mode)
    shutil.rmtree(run_dir_of(cfg), ignore_errors=True)  # a previous run's checkpoints would refuse to be overwritten
    iters: list[IterationStats] = []
    start = time.perf_counter()
    with CpuLoad() as load:
        marks, mark = marker(load)
        summary = train(cfg, on_iteration=lambda step, m: (iters.append(dockflow_iteration(m)), mark()))
    extra_keys = {**common, "max_staleness": cfg.train.max_staleness, **cpu_record(load, marks)}
    return summarize("dockflow", setup.name, iters, devices=build_plan(cfg).model_cpus(),
                     accuracy_before=summary["accuracy_before"], accuracy_after=summary["accuracy_after"],
                     wall_s=time.perf_counter() - start, extra=extra_keys, mode=mode)


def start_model(setup: Setup, cfg: Config, runs_dir: str) -> tuple[str, int]:
    """The initial policy both systems train under ``cfg`` (its seed): the SFT warm start (cached) of the tiny
    setup, a fresh model for the larger one; its directory and parameter count."""
    if setup.name == "larger":
        return build_larger_model(cfg)
    start_dir = Path(runs_dir) / f"{setup.name}_start"  # not a run directory: the runs clear theirs
    start_dir.mkdir(parents=True, exist_ok=True)
    inputs = SFTInputs(cfg.model, cfg.data, cfg.sft, cfg.checkpoint, cfg.run.seed, cfg.rollout.max_new_tokens,
                       cfg.eval.batch_size)
    model_dir = str(sft_warm_start(inputs, start_dir).model_dir)  # DockFlow's run finds it in the same cache
    return model_dir, model_params(model_dir)


def run_setup(setup: Setup, iterations: int, runs_dir: str, extra: list[str], modes: list[str],
              pairs: int = 1) -> list[dict[str, Any]]:
    """``pairs`` times DockFlow under each schedule of ``modes`` and TRL, on one setup, alternating which runs first
    (A B, B A, A B, ...: a drift of the machine's speed falls on both alike); their records, each with its ``pair``.
    Pair k runs with ``run.seed`` + k (data, initial weights, sampling), so the accuracy gains compared are those of
    ``pairs`` seeds, not one deterministic run repeated."""
    base_seed = setup_config(setup, iterations, runs_dir, extra).run.seed
    out = []
    for pair in range(pairs):
        pair_extra = [*extra, f"run.seed={base_seed + pair}"]
        cfg = setup_config(setup, iterations, runs_dir, pair_extra)
        model_dir, params = start_model(setup, cfg, runs_dir)
        common = {
            "model_dir": model_dir, "model_params": params, "G": cfg.rollout.prompts_per_iter,
            "N": cfg.rollout.group_size, "max_new_tokens": cfg.rollout.max_new_tokens, "lr": cfg.train.lr,
            "eval_prompts": cfg.eval.num_prompts, "seed": cfg.run.seed, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        runs: list[Callable[[], dict[str, Any]]] = [
            *(partial(run_dockflow, setup, mode, iterations, runs_dir, pair_extra, common) for mode in modes),
            partial(run_trl_record, setup, cfg, model_dir, runs_dir, common),
        ]
        for run in runs if pair % 2 == 0 else runs[::-1]:
            out.append({**run(), "pair": pair})
            print(json.dumps({k: v for k, v in out[-1].items() if not isinstance(v, list)}), flush=True)
    return out


def run_trl_record(setup: Setup, cfg: Config, model_dir: str, runs_dir: str, common: dict[str, Any]) -> dict[str, Any]:
    """One TRL run of a setup; its record."""
    with CpuLoad() as load:
        marks, mark = marker(load)
        trl = run_trl(cfg, model_dir, Path(runs_dir) / f"trl_{setup.name}", on_iteration=mark)
    return summarize("trl", setup.name, trl.iterations, devices=float(cfg.ray.torch_threads),
                     accuracy_before=trl.accuracy_before, accuracy_after=trl.accuracy_after, wall_s=trl.wall_s,
                     extra={**common, "eval_s": trl.eval_s, **cpu_record(load, marks)})


def machine() -> dict[str, Any]:
    import ray
    import torch
    import transformers
    import trl

    return {
        "platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
        "load_average": os.getloadavg(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "trl": trl.__version__, "ray": ray.__version__,
    }


def write(path: Path, results: list[dict[str, Any]], info: dict[str, Any]) -> None:
    """The JSON so far (after every run, so a crash keeps what finished)."""
    out = {
        "machine": info,
        "command": "python -m benchmarks.vs_trl " + " ".join(sys.argv[1:]),
        "results": results,
        "comparison": compare(results),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--setups", default="tiny,larger", help="comma-separated subset of " + ",".join(SETUPS))
    p.add_argument("--modes", default=",".join(MODES), help="DockFlow schedules to run: " + ",".join(MODES))
    p.add_argument("--tiny-iterations", type=int, default=SETUPS["tiny"].iterations)
    p.add_argument("--larger-iterations", type=int, default=SETUPS["larger"].iterations)
    p.add_argument("--runs-dir", default="runs/bench_vs_trl", help="where the runs and the larger model are written")
    p.add_argument("--pairs", type=int, default=1, help="alternating DockFlow/TRL pairs per setup (ratio: median)")
    p.add_argument("overrides", nargs="*", help="extra dotted overrides for both systems in every setup")
    args = p.parse_args(argv)
    names = args.setups.split(",")
    unknown = sorted(set(names) - set(SETUPS))
    if unknown:
        p.error(f"unknown setups {unknown}; choose from {list(SETUPS)}")
    bad_modes = sorted(set(args.modes.split(",")) - set(MODES))
    if bad_modes:
        p.error(f"unknown modes {bad_modes}; choose from {list(MODES)}")
    iterations = {"tiny": args.tiny_iterations, "larger": args.larger_iterations}
    out_path = Path(args.out)
    info = machine()
    # Records of setups not run now that are already in --out are kept (a setup can be re-run on its own).
    try:
        kept = json.loads(out_path.read_text())["results"] if out_path.is_file() else []
    except (json.JSONDecodeError, KeyError, TypeError):
        p.error(f"--out {out_path} exists but is not a results file of this benchmark (JSON with 'results'): "
                "move it away or give another path")
    results = [r for r in kept if r["setup"] not in names]
    for name in names:
        results.extend(run_setup(SETUPS[name], iterations[name], args.runs_dir, args.overrides, args.modes.split(","),
                                 args.pairs))
        write(out_path, results, info)
    info["load_average_end"] = os.getloadavg()
    results.sort(key=lambda r: (list(SETUPS).index(r["setup"]), r.get("pair", 0), r["system"], r.get("mode", "sync")))
    write(out_path, results, info)
    print_table(results, compare(results))


if __name__ == "__main__":
    main()
