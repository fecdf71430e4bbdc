"""The ``dockflow`` command line.

    dockflow train configs/grpo_arith.yaml [section.key=value ...] [--resume]
    dockflow eval  configs/grpo_arith.yaml [--model DIR] [--split test] [--limit N] [section.key=value ...]

Errors in the config or inputs print one line naming the problem and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from dockflow.config import ConfigError, load_config


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dockflow", description="RL post-training over a distributed transfer dock.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="SFT warm start, then RL; writes summary.json in the run directory")
    t.add_argument("config", help="YAML config, e.g. configs/grpo_arith.yaml")
    t.add_argument("overrides", nargs="*", help="dotted overrides: train.iterations=10")
    t.add_argument("--resume", action="store_true", help="continue from the latest committed checkpoint")
    e = sub.add_parser("eval", help="greedy held-out accuracy of a model directory")
    e.add_argument("config", help="YAML config that defines the data and template")
    e.add_argument("overrides", nargs="*", help="dotted overrides")
    e.add_argument("--model", help="HF model directory (default: the run's final_model)")
    e.add_argument("--split", default="test", choices=["test", "val"], help="which split to score")
    e.add_argument("--limit", type=int, default=None, help="score only the first N prompts")
    return p


def _cmd_train(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from dockflow.flow.trainer import train
    from dockflow.report import print_train_summary

    cfg = load_config(args.config, args.overrides)
    bars: list = []  # the RL bar starts with the first iteration, after SFT has printed its own

    def progress(step: int, m: dict[str, float]) -> None:
        if not bars:
            bars.append(tqdm(total=cfg.train.iterations, initial=step - 1, desc="RL", unit="it", dynamic_ncols=True))
        bar = bars[0]
        if bar.n < step:
            bar.update(step - bar.n)
        post = {"reward": f"{m['reward/mean']:.3f}", "s/it": f"{m['timing/iteration_s']:.2f}"}
        if "eval/test_accuracy" in m:
            post["acc"] = f"{m['eval/test_accuracy']:.3f}"
        bar.set_postfix(post)

    try:
        summary = train(cfg, resume=args.resume, on_iteration=progress)
    finally:
        for bar in bars:
            bar.close()
    print_train_summary(summary)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from dockflow.data import load_task
    from dockflow.flow.trainer import run_dir_of
    from dockflow.models import load_model_and_tokenizer
    from dockflow.models.evaluation import greedy_accuracy

    cfg = load_config(args.config, args.overrides)
    model_dir = Path(args.model) if args.model else run_dir_of(cfg) / "final_model"
    if not model_dir.is_dir():
        hint = "pass --model DIR" if args.model else f"train first (dockflow train {args.config}) or pass --model DIR"
        raise FileNotFoundError(f"model directory '{model_dir}' does not exist: {hint}")
    model, tok = load_model_and_tokenizer(model_dir, dtype=cfg.model.dtype)
    examples = getattr(load_task(cfg.data, cfg.run.seed), args.split)[: args.limit or None]
    acc = greedy_accuracy(model, tok, examples, cfg.eval.batch_size, cfg.rollout.max_new_tokens, cfg.data.prompt_template)
    print(json.dumps({"model": str(model_dir), "split": args.split, "prompts": len(examples), "accuracy": acc}))
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    try:
        return {"train": _cmd_train, "eval": _cmd_eval}[args.command](args)
    except Exception as exc:
        # Our own errors (config, dataset, model files, cluster, workers, stages, dock, tracking) already say
        # what is wrong and what to do: one line, no traceback. Anything else is a bug and keeps its traceback.
        ours = type(exc).__module__.startswith("dockflow.") or isinstance(exc, (ConfigError, FileNotFoundError))
        if not ours:
            raise
        print(f"dockflow {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
