"""Every rollout-correction mode in a whole run on vLLM's CPU build: ``train`` on the tiny arithmetic task (the
suite's tiny settings, no SFT), ``--iterations`` iterations per mode, one local Ray cluster, and what each run
logged: the ratio's mean and max, the weight's mean and the share masked or truncated, per iteration.

The generator is disaggregated with ``train.max_staleness=1`` by default (``--placement``), so the trainer's
old log-probs can be a version ahead of the weights that sampled, and the ratios are not all 1.

Usage: ``python -m benchmarks.rollout_correction_vllm --out rollout_correction_vllm.json [--iterations 3]
[--placement disaggregated|colocated]``.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
from pathlib import Path

from benchmarks.results_file import write_results
from dockflow.config import load_config
from dockflow.tracking import read_metric_history, resolve_tracking_uri

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "geometric_mask")
TINY = {"data.arithmetic.digits": 1, "data.arithmetic.ops": "[+]", "data.arithmetic.num_train": 60,
        "data.arithmetic.num_labeled": 60, "data.arithmetic.num_val": 20, "data.arithmetic.num_test": 20,
        "sft.enabled": "false", "rollout.prompts_per_iter": 4, "rollout.group_size": 4, "rollout.batch_size": 8,
        "rollout.temperature": 1.5, "train.mini_batch_size": 8, "train.micro_batch_size": 4,
        "train.infer_batch_size": 8, "train.epochs": 2, "train.lr": 1e-3, "ray.actor_cpus": 1,
        "ray.reference_cpus": 1, "ray.critic_cpus": 0, "ray.torch_threads": 1, "eval.every": 0,
        "checkpoint.every": 0, "registry.model_name": "null", "engine.backend": "vllm", "engine.device": "cpu",
        "engine.vllm.kv_cache_memory_gb": 0.25, "engine.vllm.enforce_eager": "true"}
KEYS = ("ratio_mean", "ratio_max", "weight_mean", "masked_share", "truncated_share")


def main(argv: list[str] | None = None) -> int:
    import ray

    from dockflow.flow.trainer import train

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="rollout_correction_vllm.json")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--placement", choices=("disaggregated", "colocated"), default="disaggregated")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="dockflow-rc-"))
    placement = {"placement.mode": args.placement, "placement.generator_cpus": 0, "train.max_staleness": 1} \
        if args.placement == "disaggregated" else {"dock.backend": "centralized"}
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    results = []
    try:
        for mode in MODES:
            overrides = {**TINY, **placement, "run.name": f"rc-{mode}", "run.output_dir": str(work / "runs"),
                         "train.iterations": args.iterations, "train.rollout_correction.mode": mode,
                         "train.rollout_correction.lower": 0.5 if "mask" in mode else "null"}
            cfg = load_config("configs/grpo_arith.yaml", [f"{k}={v}" for k, v in overrides.items()])
            out = train(cfg)
            uri = resolve_tracking_uri(cfg.tracking.uri, cfg.run.output_dir)
            logged = {key: dict(read_metric_history(uri, out["mlflow_run_id"], f"train/rollout_is_{key}"))
                      for key in KEYS}
            results.append({"mode": mode, "iterations": out["iterations"],
                            **{key: [round(v, 6) for _, v in sorted(h.items())] for key, h in logged.items() if h}})
    finally:
        ray.shutdown()
    for r in results:
        print(r["mode"], {k: v for k, v in r.items() if k != "mode"})
    write_results(args.out, results, placement=args.placement, date=datetime.date.today().isoformat(),
                  command="python -m benchmarks.rollout_correction_vllm " + " ".join(argv or sys.argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
