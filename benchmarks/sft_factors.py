"""The SFT warm start with each seed-driven factor on its own seed (issue 47): the data draw, the tokenizer's merges,
the initial weights and the batch order, with optional weight decay, labeled rows, learning rate, init scale, batch
size, warm-up, a cosine decay and a moving average of the weights (validated beside the weights themselves).

    python -m benchmarks.sft_factors --data 2 --tok 2 --init 2 --order 2 --wd 1.0 --ema 0.995 [--epochs 150]

Prints one line per validation (every 4 epochs: train loss, the weights' and the average's validation accuracy)
and, with ``--ema``, both models' test accuracy at the end; then one JSON line with the arguments and the history.
The numbers it gave are in docs/data_and_models.md, 'Over seeds'.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from dockflow.config import load_config
from dockflow.data import PromptFormat, load_task
from dockflow.eval.greedy import greedy_accuracy
from dockflow.flow.sft import WeightAverage, _make_batches, _train_epoch
from dockflow.models.factory import build_tiny_model
from dockflow.models.tokenizer import build_task_tokenizer
from dockflow.rewards.verifier import task_verifier


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for factor in ("data", "tok", "init", "order"):
        p.add_argument(f"--{factor}", type=int, default=0, help=f"seed of the {factor} factor")
    p.add_argument("--wd", type=float, default=0.0, help="AdamW weight decay")
    p.add_argument("--lr", type=float, default=None, help="peak lr (default: the config's sft.lr)")
    p.add_argument("--labeled", type=int, default=None, help="labeled rows (default: the config's)")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--init-std", type=float, default=None, help="re-initialise with this std")
    p.add_argument("--bs", type=int, default=None, help="batch size (default: the config's)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: the config's)")
    p.add_argument("--decay", action="store_true", help="cosine lr decay after the warm-up")
    p.add_argument("--ema", type=float, default=0.0, help="also validate the weights' moving average (this decay)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    torch.set_num_threads(1)
    cfg = load_config("configs/grpo_arith.yaml", [])
    data = cfg.data
    if a.labeled:
        data = data.model_copy(update={"arithmetic": data.arithmetic.model_copy(update={"num_labeled": a.labeled})})
    task = load_task(data, a.data)
    tok = build_task_tokenizer(data, a.tok, cfg.model.tiny.tokenizer_merges)
    model = build_tiny_model(cfg.model.tiny, tok, seed=a.init)
    if a.init_std is not None:
        model.config.initializer_range = a.init_std
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(a.init)
            model.apply(model._init_weights)
    fmt, verifier = PromptFormat.of(data), task_verifier(data)
    batch, warmup = a.bs or cfg.sft.batch_size, cfg.sft.warmup_steps if a.warmup is None else a.warmup
    total = -(-len(task.labeled) // batch) * a.epochs
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr or cfg.sft.lr, weight_decay=a.wd)

    def factor(step: int) -> float:
        if a.decay and step >= warmup:
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))
        return min(1.0, (step + 1) / max(warmup, 1))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    average = WeightAverage(model, a.ema)  # --ema 0: the weights themselves

    def accuracy(m: torch.nn.Module, rows: list) -> float:
        return greedy_accuracy(m, tok, rows, 200, cfg.rollout.max_new_tokens, fmt, verifier)

    gen, start, history = torch.Generator().manual_seed(a.order), time.time(), []
    for epoch in range(1, a.epochs + 1):
        loss = _train_epoch(model, opt, sched, _make_batches(tok, task.labeled, fmt, batch, gen), average)
        if epoch % 4 == 0:
            row = [epoch, round(loss, 3), accuracy(model, task.val), accuracy(average.model, task.val) if a.ema else None]
            history.append(row)
            print(f"epoch {epoch} loss {loss:.3f} val {row[2]:.3f} average {row[3]} t {time.time() - start:.0f}s",
                  flush=True)
    if a.ema:
        print(f"test: weights {accuracy(model, task.test):.3f} average {accuracy(average.model, task.test):.3f}")
    print(json.dumps({"args": vars(a), "history": history}))


if __name__ == "__main__":
    main()
