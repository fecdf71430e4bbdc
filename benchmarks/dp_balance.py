"""Sequence-length balancing of the actor update across DP ranks, side by side on 2 gloo ranks (CPU).

Every step trains one mini-batch of rollouts with lognormal response lengths (the same batches in every mode)
on a tiny Qwen2 with ``FSDPTrainingEngine``, each rank one process and one thread. The modes differ only in
which rows a rank gets and in what order it cuts them into micro-batches:

- ``index``: each rank takes its half in index order (the dock's plain lowest-first get), micro-batches in
  order: DockFlow before ``train.seqlen_balance``.
- ``index_sorted``: the same halves, each sorted by length before it is cut into micro-batches.
- ``balanced_shares``: the dock's controller splits the mini-batch by response length (``ControllerState.take``
  with ``dp_share``, Karmarkar-Karp on metadata); micro-batches in index order.
- ``balanced_sorted``: the same shares, each sorted by length before it is cut (``workers/update_loop.length_sorted``):
  what ``train.seqlen_balance: true`` does.

Reported per mode: the update step's wall time (median over steps; FSDP's collectives make every rank wait for
the slowest, so it is the step time; they also synchronise every micro-batch, so a step costs the sum over
micro-batches of the slowest rank's), the token positions the busiest rank computed over the mean
(``train/dp_load_imbalance``) and the share of computed positions that were padding (``train/padding_fraction``).

Usage: ``python -m benchmarks.dp_balance --out dp_balance.json [--steps 8] [--rows 64] [--micro 8]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tensordict import TensorDict
from transformers import Qwen2Config, Qwen2ForCausalLM

from benchmarks.results_file import write_results
from dockflow.dock.controller import ControllerState
from dockflow.workers.update_loop import length_sorted

WORLD = 2
MODES = ("index", "index_sorted", "balanced_shares", "balanced_sorted")
VOCAB, PROMPT_WIDTH = 64, 16


def tiny_model() -> Qwen2ForCausalLM:
    """The demo's tiny Qwen2 shape (hidden 128, 4 layers), positions for the longest rollout."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=512, max_position_embeddings=1024,
                         tie_word_embeddings=True)
    return Qwen2ForCausalLM(config)


def rollouts(step: int, rows: int, width: int, mu: float, sigma: float) -> TensorDict:
    """A mini-batch in the dock's layout: prompts of 8-16 tokens left-padded, responses of lognormal length."""
    gen = torch.Generator().manual_seed(step)
    rng = np.random.default_rng(step)
    lengths = torch.from_numpy(np.clip(np.rint(rng.lognormal(mu, sigma, rows)), 1, width).astype(np.int64))
    prompt_lengths = torch.randint(8, PROMPT_WIDTH + 1, (rows,), generator=gen)
    response_mask = (torch.arange(width) < lengths[:, None]).long()
    prompt_mask = (torch.arange(PROMPT_WIDTH).flip(0) < prompt_lengths[:, None]).long()
    responses = torch.randint(1, VOCAB, (rows, width), generator=gen) * response_mask
    prompts = torch.randint(1, VOCAB, (rows, PROMPT_WIDTH), generator=gen) * prompt_mask
    return TensorDict({
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": torch.cat([prompt_mask, response_mask], 1),
        "responses": responses,
        "response_mask": response_mask,
        "advantages": torch.randn(rows, generator=gen),
        "response_length": lengths,
    }, batch_size=[rows])


def share(batch: TensorDict, mode: str, rank: int, micro: int) -> TensorDict:
    """This rank's rows of the mini-batch under ``mode``, in the order they are cut into micro-batches."""
    rows = batch.batch_size[0]
    if mode.startswith("index"):
        mine = batch[rank * rows // WORLD : (rank + 1) * rows // WORLD]
        return length_sorted(mine, micro) if mode == "index_sorted" else mine
    controller = ControllerState("actor_update", ["rollout"], rows)
    controller.mark_ready(np.arange(rows), ["rollout"], {"response_length": batch["response_length"].numpy()})
    mine = batch[torch.from_numpy(controller.take(rows // WORLD, ["rollout"], dp_share=(rank, WORLD)))]
    return mine if mode == "balanced_shares" else length_sorted(mine, micro)


def loss_fn(logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
    """A policy-gradient surrogate: the cost is the forward and backward, not the loss."""
    mask = micro["response_mask"]
    return -(logp * mask * micro["advantages"][:, None]).sum() / tokens, {}


def _rank(rank: int, args: argparse.Namespace, store_path: str, out_dir: str) -> None:
    from dockflow.engines.fsdp_training import FSDPTrainingEngine

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD), rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=600))
    engine = FSDPTrainingEngine(tiny_model(), lr=1e-4)
    records: list[dict[str, Any]] = []
    for step in range(args.warmup + args.steps):
        batch = rollouts(step, args.rows, args.width, args.mu, args.sigma)
        for mode in MODES[step % len(MODES):] + MODES[: step % len(MODES)]:  # rotate: no mode always first
            mine = share(batch, mode, rank, args.micro)
            dist.barrier()
            start = time.perf_counter()
            metrics = engine.train_mini_batch(mine, loss_fn, args.micro)
            elapsed = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if step >= args.warmup:
                records.append({"mode": mode, "step": step, "step_s": float(elapsed),
                                "padding_fraction": metrics["train/padding_fraction"],
                                "dp_load_imbalance": metrics["train/dp_load_imbalance"]})
    if rank == 0:
        torch.save(records, Path(out_dir) / "records.pt")
    dist.barrier()
    dist.destroy_process_group()


def summarise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for mode in MODES:
        mine = [r for r in records if r["mode"] == mode]
        out.append({
            "mode": mode,
            "step_s": statistics.median(r["step_s"] for r in mine),
            "dp_load_imbalance": statistics.mean(r["dp_load_imbalance"] for r in mine),
            "padding_fraction": statistics.mean(r["padding_fraction"] for r in mine),
            "steps": len(mine),
        })
    base = out[0]["step_s"]
    for r in out:
        r["speedup_vs_index"] = base / r["step_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--steps", type=int, default=8, help="measured steps per mode")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps per mode first")
    parser.add_argument("--rows", type=int, default=64, help="samples per mini-batch (both ranks together)")
    parser.add_argument("--micro", type=int, default=8, help="rows per micro-batch")
    parser.add_argument("--width", type=int, default=256, help="max response tokens")
    parser.add_argument("--mu", type=float, default=3.5, help="mean of log(response length)")
    parser.add_argument("--sigma", type=float, default=1.0, help="std of log(response length): the tail")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps must be >= 1 and --warmup >= 0, not {args.steps} and {args.warmup}")
    if args.rows % (WORLD * args.micro):
        parser.error(f"--rows ({args.rows}) must be a multiple of {WORLD} x --micro ({args.micro})")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_rank, args=(args, str(Path(tmp) / "store"), tmp), nprocs=WORLD, start_method="fork")
        results = summarise(torch.load(Path(tmp) / "records.pt", weights_only=False))
    print(f"{'mode':<16} {'step s':>8} {'vs index':>9} {'busiest/mean':>13} {'padding':>8}")
    for r in results:
        print(f"{r['mode']:<16} {r['step_s']:>8.3f} {r['speedup_vs_index']:>8.2f}x "
              f"{r['dp_load_imbalance']:>13.3f} {r['padding_fraction']:>8.3f}")
    write_results(args.out, results, world=WORLD, rows=args.rows, micro=args.micro, width=args.width,
                  mu=args.mu, sigma=args.sigma, torch=torch.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
