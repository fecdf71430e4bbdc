"""The ``dockflow`` command line.

    dockflow train   configs/grpo_arith.yaml [section.key=value ...] [--resume]
    dockflow eval    configs/grpo_arith.yaml [--model DIR] [--split test] [--limit N] [--data FILE.jsonl]
                     [--k K] [--temperature T] [--mlflow-run RUN_ID] [section.key=value ...]
    dockflow compare RUN_OR_EXPERIMENT [...] [--tracking-uri URI] [--metrics a,b] [--json]
    dockflow sft     [configs/grpo_arith.yaml] [section.key=value ...]
    dockflow pipeline compile  [--config FILE] [--out FILE.yaml] [section.key=value ...]
    dockflow pipeline run      [--config FILE] (--local | --host URL) [--iterations N] [--run-name NAME]
                               [--continue-from base|latest|champion] [section.key=value ...]
    dockflow pipeline schedule [--config FILE] --host URL --cron "0 0 2 * * *" [--continue-from champion] [...]
    dockflow pipeline teardown RUN_NAME --ray-address ADDRESS

Errors in the config or inputs, and a Ray head that is not there or goes away mid-run, print one line naming the
problem and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from dockflow.config import ConfigError, load_config
from dockflow.redact import redact_text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dockflow", description="RL post-training over a distributed transfer dock.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="SFT warm start, then RL; writes summary.json in the run directory")
    t.add_argument("config", help="YAML config, e.g. configs/grpo_arith.yaml")
    t.add_argument("overrides", nargs="*", help="dotted overrides: train.iterations=10")
    t.add_argument("--resume", action="store_true", help="continue from the latest committed checkpoint")
    e = sub.add_parser("eval", help="greedy accuracy, pass@k and avg@k of a model directory")
    e.add_argument("config", help="YAML config that defines the data and template")
    e.add_argument("overrides", nargs="*", help="dotted overrides")
    e.add_argument("--model", help="HF model directory (default: the run's final_model)")
    e.add_argument("--split", default="test", choices=["test", "val"], help="which split to score")
    e.add_argument("--limit", type=int, default=None, help="score only the first N prompts")
    e.add_argument("--data", help="score this JSONL/Parquet file (rows: prompt or problem, answer) instead of a split")
    e.add_argument("--k", type=int, default=None, help="samples per prompt for pass@k/avg@k (default: eval.pass_k)")
    e.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: eval.temperature)")
    e.add_argument("--mlflow-run", help="also log the scores to this MLflow run (tracking.uri of the config)")
    c = sub.add_parser("compare", help="side-by-side table of MLflow runs: tags, final metrics, differing params")
    c.add_argument("runs", nargs="+", help="run ids, run names or experiment names")
    c.add_argument("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI)")
    c.add_argument("--metrics", help="comma-separated metric names (default: accuracy, reward, throughput, s/iteration)")
    c.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s = sub.add_parser("sft", help="the SFT warm start alone (or its cached result): validation history, test accuracy")
    s.add_argument("args", nargs="*", metavar="ARG", help="an optional YAML config, then dotted overrides")
    _pipeline_parser(sub.add_parser("pipeline", help="the Kubeflow pipeline: compile, run, schedule"))
    return p


def _pipeline_parser(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--config", default="configs/grpo_arith.yaml", help="YAML config (a path in the image for --host)")
        q.add_argument("overrides", nargs="*", help="dotted overrides, passed to the run: rollout.temperature=0.8")

    def run_time(q: argparse.ArgumentParser) -> None:
        q.add_argument("--run-name", default="", help="the run's name (default: the config's name and the KFP run id); "
                       "a name that has checkpoints resumes that run")
        q.add_argument("--iterations", type=int, help="RL iterations (default: the config's)")
        q.add_argument("--max-staleness", type=int, help="policy versions generation may run ahead (default: config)")
        q.add_argument("--eval-every", type=int, help="evaluate every N iterations (default: the config's)")
        q.add_argument("--checkpoint-every", type=int, help="checkpoint every N iterations (default: 10)")
        q.add_argument("--continue-from", default="", choices=["", "base", "latest", "champion"],
                       help="start from the base model, or the latest / champion registered version")

    def remote(q: argparse.ArgumentParser) -> None:
        q.add_argument("--image", default="", help="container image of the tasks (default: the DockFlow cpu image)")
        q.add_argument("--ray-address", default="", help="Ray cluster the tasks join (default: $RAY_ADDRESS in the pods)")
        q.add_argument("--mlflow-uri", default="", help="MLflow server (default: $MLFLOW_TRACKING_URI, then the config)")
        q.add_argument("--s3-endpoint", default="", help="S3/MinIO endpoint of the checkpoints")
        q.add_argument("--s3-bucket", default="", help="checkpoints go to s3://BUCKET/RUN_NAME")
        q.add_argument("--experiment", default="dockflow", help="KFP experiment name")

    c = sub.add_parser("compile", help="write the pipeline's YAML (upload it in the Kubeflow UI)")
    common(c)
    c.add_argument("--out", help="output file (default: <run.output_dir>/dockflow-rl.yaml)")
    r = sub.add_parser("run", help="run the pipeline here (--local) or on a KFP host (--host)")
    common(r)
    run_time(r)
    where = r.add_mutually_exclusive_group(required=True)
    where.add_argument("--local", action="store_true", help="kfp.local subprocesses against a local Ray cluster")
    where.add_argument("--host", help="KFP API, e.g. http://localhost:8080")
    remote(r)
    s = sub.add_parser("schedule", help="a recurring run on a KFP host")
    common(s)
    run_time(s)
    s.add_argument("--host", required=True, help="KFP API, e.g. http://localhost:8080")
    s.add_argument("--cron", required=True, help='6-field cron, seconds first: "0 0 2 * * *" = 02:00 daily')
    s.add_argument("--name", help="recurring run name (default: <run.name>-recurring)")
    remote(s)
    t = sub.add_parser("teardown", help="end a pipeline run whose exit task did not run: kill its actors")
    t.add_argument("run_name", help="the run's name (its MLflow run name)")
    t.add_argument("--ray-address", required=True, help="the Ray cluster it runs on")
    t.add_argument("--namespace", help="its Ray namespace (default: dockflow-RUN_NAME)")


def _cmd_train(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)  # before the heavy imports: a bad key fails in a second

    from dockflow.flow.trainer import train
    from dockflow.report import ProgressBar, print_train_summary

    progress = ProgressBar(cfg.train.iterations)

    def head_lost(message: str) -> None:  # from the watch thread: the main one waits in Ray
        progress.close()
        print(f"dockflow train: error: {redact_text(message)}", file=sys.stderr, flush=True)
        os._exit(2)

    try:
        summary = train(cfg, resume=args.resume, on_iteration=progress, on_head_lost=head_lost)
    finally:
        progress.close()
    print_train_summary(summary)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from dockflow.eval import EvalInputs
    from dockflow.eval.command import EvalRun, run_eval

    overrides = list(args.overrides)
    if args.k is not None:
        overrides.append(f"eval.pass_k={args.k}")
    if args.temperature is not None:
        overrides.append(f"eval.temperature={args.temperature}")
    cfg = load_config(args.config, overrides)
    scoring = EvalInputs(cfg.eval, cfg.data, cfg.rollout.max_new_tokens, cfg.run.seed, cfg.tools)
    setup = EvalRun(scoring, cfg.checkpoint, cfg.run, cfg.tracking, cfg.model.dtype)
    result = run_eval(setup, args.config, args.model, args.split, args.limit, args.data, args.mlflow_run)
    print(json.dumps(result))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from dockflow.tracking.compare import DEFAULT_METRICS, compare_runs, print_comparison

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else list(DEFAULT_METRICS)
    cmp = compare_runs(args.runs, args.tracking_uri, metrics)
    if args.json:
        print(json.dumps(cmp, indent=2))
    else:
        print_comparison(cmp)
    return 0


def _cmd_sft(args: argparse.Namespace) -> int:
    rest = list(args.args)
    path = rest.pop(0) if rest and "=" not in rest[0] else None
    cfg = load_config(path, rest)

    import torch

    from dockflow.flow.sft import SFTInputs, check_learned, sft_report

    torch.set_num_threads(min(2, torch.get_num_threads()))
    inputs = SFTInputs(cfg.model, cfg.data, cfg.sft, cfg.checkpoint, cfg.run.seed, cfg.rollout.max_new_tokens,
                       cfg.eval.batch_size, cfg.tools)
    lines, result = sft_report(inputs, Path(cfg.run.output_dir) / cfg.run.name, cfg.eval.num_prompts)
    print("\n".join(lines), flush=True)
    check_learned(result, cfg.sft.min_val_accuracy)  # after the history, so the user sees how it went
    return 0


def _cmd_pipeline(args: argparse.Namespace) -> int:
    from dockflow.report import ProgressBar, print_train_summary
    from pipelines import launch

    if args.action == "teardown":
        from dockflow.flow.pipeline_tasks import teardown

        teardown(args.namespace or f"dockflow-{args.run_name}", args.run_name, args.ray_address, succeeded=False)
        return 0
    cfg = load_config(args.config, args.overrides)
    if args.action == "compile":
        print(launch.compile_pipeline(launch.options_for(cfg, args.config), args.out or launch.default_package(cfg)))
        return 0
    given = {"run_name": args.run_name, "iterations": args.iterations, "max_staleness": args.max_staleness,
             "eval_every": args.eval_every, "checkpoint_every": args.checkpoint_every,
             "continue_from": args.continue_from}
    if args.iterations is not None:  # the progress bar and the checks see the run's own values
        cfg = load_config(args.config, [*args.overrides, f"train.iterations={args.iterations}"])
    if args.action == "run" and args.local:
        progress = ProgressBar(cfg.train.iterations)
        try:
            summary = launch.run_local(args.config, args.overrides, cfg, on_iteration=progress, **given)
        finally:
            progress.close()
        print_train_summary(summary)
        return 0
    extra = {"image": args.image, "ray_address": args.ray_address, "mlflow_uri": args.mlflow_uri,
             "s3_endpoint": args.s3_endpoint, "s3_bucket": args.s3_bucket}
    params = launch.arguments(args.config, args.overrides, cfg, **given, **extra)
    opts = launch.options_for(cfg, args.config)
    if args.action == "run":
        print(f"run {launch.submit(args.host, params, opts, args.experiment)} started on {args.host}")
        return 0
    name = args.name or f"{cfg.run.name}-recurring"
    job = launch.schedule(args.host, args.cron, params, opts, args.experiment, name, launch.default_package(cfg))
    print(f"recurring run {job} ({name}, cron {args.cron!r}) created on {args.host}")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)  # its retries; the error line counts them
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "Creating initial MLflow database tables"
    args = _parser().parse_args(argv)
    try:
        commands = {"train": _cmd_train, "eval": _cmd_eval, "compare": _cmd_compare, "sft": _cmd_sft,
                    "pipeline": _cmd_pipeline}
        return commands[args.command](args)
    except Exception as exc:
        # Our own errors (config, dataset, model files, cluster, workers, stages, dock, tracking) already say
        # what is wrong and what to do: one line, no traceback. Anything else is a bug and keeps its traceback.
        # A full disk anywhere (a run's directory, a cache) is one line too, not a traceback.
        from dockflow.storage.write_errors import no_room_line

        ours = type(exc).__module__.startswith(("dockflow.", "pipelines.")) or isinstance(exc, (ConfigError, FileNotFoundError))
        full = no_room_line(exc)
        if not ours and full is None:
            raise
        print(f"dockflow {args.command}: error: {redact_text(full or str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
