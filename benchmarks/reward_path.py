"""The reward worker's scoring of one demo iteration, the function in its child process vs in the worker, side by side.

The demo's reward (``configs/grpo_arith.yaml``: the built-in ``math_verify``, G=32 x N=8 = 256 completions of up
to 8 tokens, one dock batch of ``train.infer_batch_size`` = 256) is scored by two ``RewardWorker`` Ray actors on
one transfer dock: ``child``, the function in the reward worker's child process (``isolate: true``: every
function's path before this change), and ``in_worker``, the function in the worker itself (the built-ins' path
now). Each pass writes the same 256 finished rollouts into the iteration's dock window (half of them right), then
calls ``compute_rewards`` and ``compute_advantages`` as the stage loops do; the passes alternate between the two
paths, so load from other processes falls on both alike.

Reported per path (median over ``--repeats`` passes after two uncounted warm-ups each), in milliseconds:
``call`` (``compute_rewards`` as the driver sees it, Ray's call included), ``reward`` (the worker's own
``timing/reward_s``), of that ``wait`` (the dock get: here the rollouts are already there) and ``functions`` (the
scoring call, any process hop included), of that ``own`` (the function's own time where it ran); ``hop``
(functions - own: pickling, the pipe, waking the child up), ``rest`` (reward - wait - functions: decoding, the
verifier's ``reward/correct_fraction``, shaping, the dock put) and ``advantage`` (``compute_advantages`` as the
driver sees it). In the driver, on the same rollouts: ``decode_before`` and ``decode_now`` (the token ids and
texts the functions get: tensor indexing and ``tokenizer.decode`` row by row, as the worker did before, and
``response_ids`` with one batch decode, as it does now), ``verify`` (``math_verify`` on the 256 completions).
Timings are not asserted anywhere.

Usage: ``python -m benchmarks.reward_path --out reward_path.json [--repeats 20] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from benchmarks.results_file import write_results  # noqa: E402
from dockflow.config import Config, load_config  # noqa: E402
from dockflow.data import load_task  # noqa: E402
from dockflow.engines import decode_responses, response_ids  # noqa: E402
from dockflow.models import build_char_tokenizer  # noqa: E402
from dockflow.rewards.builtins import math_verify  # noqa: E402
from dockflow.workers.resources import build_plan

CONFIG = "configs/grpo_arith.yaml"
PATHS = {"child": "[{name: math_verify, isolate: true}]", "in_worker": "[{name: math_verify}]"}
COLUMNS = ("call", "reward", "wait", "functions", "own", "hop", "rest", "advantage")


def path_config(path: str, out_dir: str) -> Config:
    """The demo config with the path's reward functions."""
    return load_config(CONFIG, [f"run.output_dir={out_dir}", "run.name=reward_path", "train.old_log_prob=rollout",
                                f"reward.functions={PATHS[path]}", "registry.model_name=null"])


def rollouts(cfg: Config, tokenizer: Any, answers: list[str], seed: int) -> tuple[TensorDict, dict[str, torch.Tensor]]:
    """G x N finished rollouts of the first G train prompts: each response the answer or a wrong number, then EOS,
    right-padded to ``rollout.max_new_tokens``; the columns and metadata generation puts into the dock."""
    rng = random.Random(seed)
    g, n, width = cfg.rollout.prompts_per_iter, cfg.rollout.group_size, cfg.rollout.max_new_tokens
    rows = torch.full((g * n, width), tokenizer.pad_token_id)
    mask = torch.zeros((g * n, width), dtype=torch.long)
    for k in range(g * n):
        answer = answers[k // n]
        text = answer if rng.random() < 0.5 else str(int(answer) + rng.randint(1, 9))
        ids = (tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id])[:width]
        rows[k, : len(ids)] = torch.tensor(ids)
        mask[k, : len(ids)] = 1
    prompt = torch.ones((g * n, 4), dtype=torch.long)
    data = TensorDict({"input_ids": prompt, "attention_mask": prompt, "responses": rows, "response_mask": mask,
                       "rollout_log_prob": torch.zeros((g * n, width)), "old_log_prob": torch.zeros((g * n, width))},
                      batch_size=[g * n])
    meta = {"prompt_id": torch.arange(g).repeat_interleave(n), "response_length": mask.sum(1),
            "policy_version": torch.zeros(g * n, dtype=torch.long)}
    return data, meta


def one_pass(worker: Any, dock: Any, cfg: Config, iteration: int, rollout: tuple[TensorDict, dict]) -> dict[str, float]:
    """Write the rollouts into ``iteration``'s window, then score them and compute advantages; milliseconds."""
    import ray

    lo, hi = build_plan(cfg).dock_window(iteration)
    dock.reset(window=(lo, hi))
    dock.put(list(range(lo, hi)), *rollout)
    start = time.perf_counter()
    rewards = ray.get(worker.compute_rewards.remote(iteration), timeout=120)
    called = time.perf_counter()
    ray.get(worker.compute_advantages.remote(iteration), timeout=120)
    done = time.perf_counter()
    ms = {"call": called - start, "advantage": done - called, "reward": rewards["timing/reward_s"],
          "wait": rewards["timing/reward_wait_s"], "functions": rewards["timing/reward_functions_s"],
          "own": rewards["timing/reward_functions_own_s"]}
    ms["hop"] = ms["functions"] - ms["own"]
    ms["rest"] = ms["reward"] - ms["wait"] - ms["functions"]
    return {k: v * 1e3 for k, v in ms.items()}


def driver_parts(tokenizer: Any, rollout: tuple[TensorDict, dict], answers: list[str], n: int) -> dict[str, float]:
    """Milliseconds, here in the driver: the responses' token ids and texts as the worker took them before
    (tensor indexing and ``decode`` row by row) and now (``response_ids``, one batch decode), and math_verify."""
    responses, mask = rollout[0]["responses"], rollout[0]["response_mask"]
    start = time.perf_counter()
    ids = [r[m.bool()].tolist() for r, m in zip(responses, mask, strict=True)]
    before = [tokenizer.decode(row, skip_special_tokens=True) for row in ids]
    rows = time.perf_counter()
    ids = response_ids(responses, mask)
    texts = decode_responses(tokenizer, responses, mask, ids)
    decoded = time.perf_counter()
    assert texts == before
    math_verify([""] * len(texts), texts, answer=[answers[k // n] for k in range(len(texts))])
    return {"decode_before": (rows - start) * 1e3, "decode_now": (decoded - rows) * 1e3,
            "verify": (time.perf_counter() - decoded) * 1e3}


def run(repeats: int, seed: int) -> dict[str, Any]:
    import ray

    from dockflow.workers.reward import RewardWorker
    from dockflow.workers.run_dock import create_run_dock

    out_dir = tempfile.mkdtemp(prefix="reward_path_")
    configs = {p: path_config(p, out_dir) for p in PATHS}
    cfg = configs["in_worker"]
    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(f"{out_dir}/tokenizer")
    answers = [ex.answer for ex in load_task(cfg.data, cfg.run.seed).train[: cfg.rollout.prompts_per_iter]]
    rollout = rollouts(cfg, tokenizer, answers, seed)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="reward_path")
    try:
        dock = create_run_dock(cfg, build_plan(cfg), "reward_path")
        workers = {p: ray.remote(RewardWorker).options(num_cpus=0, max_concurrency=1).remote(
            c, f"{out_dir}/tokenizer", dock) for p, c in configs.items()}
        ray.get([w.ready.remote() for w in workers.values()], timeout=300)
        samples: dict[str, list[dict[str, float]]] = {p: [] for p in PATHS}
        local: list[dict[str, float]] = []
        for k in range(repeats + 2):
            for p, w in workers.items():
                took = one_pass(w, dock, configs[p], k, rollout)
                if k >= 2:  # warm-ups uncounted
                    samples[p].append(took)
            local.append(driver_parts(tokenizer, rollout, answers, cfg.rollout.group_size))
        dock.shutdown()
    finally:
        ray.shutdown()
    results = [{"path": p, "samples": len(rollout[0]), "repeats": repeats,
                **{c: statistics.median(s[c] for s in samples[p]) for c in COLUMNS}} for p in PATHS]
    driver = {c: statistics.median(x[c] for x in local[2:]) for c in ("decode_before", "decode_now", "verify")}
    return {"results": results, "driver": driver, "load_1min": os.getloadavg()[0]}


def print_table(found: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Reward worker, one demo iteration (256 completions): median ms")
    for c in ("path", *COLUMNS):
        table.add_column(c, justify="left" if c == "path" else "right")
    for r in found["results"]:
        table.add_row(r["path"], *(f"{r[c]:.2f}" for c in COLUMNS))
    Console().print(table)
    d = found["driver"]
    print(f"in the driver: token ids and texts before {d['decode_before']:.2f} ms, now {d['decode_now']:.2f} ms; "
          f"math_verify {d['verify']:.2f} ms; "
          f"load average (1 min) {found['load_1min']:.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reward_path.json")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    found = run(args.repeats, args.seed)
    print_table(found)
    write_results(args.out, found["results"], driver_ms=found["driver"], load_1min=found["load_1min"])


if __name__ == "__main__":
    main()
