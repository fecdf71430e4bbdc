"""How the update scales with response lengths, side by side in one run: benchmarks/scale.py's parts (b) and (c).

- ``long-tail`` (b): 16 responses drawn log-normal with a median of about 300 tokens, the longest 4,096, after a
  16-token prompt; one update (one mini-batch of all 16) of a thin Qwen2 (hidden 128, 2 layers, fp32) through
  ``TorchTrainingEngine``, four ways:
  - ``before``: the engine before issue 41: 4 rows per micro-batch in the drawn order, the whole logits at the
    response positions and ``log_softmax`` (what ``benchmarks/scale.py`` calls ``whole``), every row padded;
  - ``samples``: 4 rows per micro-batch, the chunked head, every micro-batch padded (the shared-prompt pass);
  - ``tokens``: rows sorted by length (``train.seqlen_balance``) and cut by ``--budget`` tokens
    (``train.max_tokens_per_micro_batch``), padded;
  - ``tokens+packing``: the same micro-batches, packed where packing pays (``engines/packing.py``): today's engine.
  The vocabulary is 32,000 (``--vocab``): the ``before`` path's whole logits of 4 x 4,112 positions at 151,936
  would take 30 GiB with their backward, more than this machine has.
- ``lengths`` (c): at the real vocabulary (151,936), 4 rows of a 16-token prompt and ``R`` response tokens for
  ``R`` = 256, 512, ..., 4,096: one engine-level iteration (HF sampling of exactly ``R`` tokens, the old log-probs,
  one update of all 4 rows) with today's engine; seconds of each phase and the process's peak resident memory.

Each case runs in a fresh process; peak memory is the process's ``VmHWM`` minus its resident memory once the model
and batch are built. Usage: ``python -m benchmarks.scale_lengths --part long-tail|lengths --out FILE.json``.
Nothing is asserted; tests/unit/benchmarks/test_scale_lengths.py runs small cases.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.host_memory import memory_mb
from benchmarks.results_file import write_results
from dockflow.algos import recipe_of

WAYS = ("before", "samples", "tokens", "tokens+packing")
PROMPT = 16


def long_tail_lengths(rows: int, longest: int, seed: int = 0) -> list[int]:
    """Response lengths: log-normal around a median of 300 tokens, clipped to [16, longest], the last one longest."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    drawn = (torch.randn(rows - 1, generator=gen) * 1.0 + torch.log(torch.tensor(300.0))).exp()
    return [int(x) for x in drawn.clamp(16, longest)] + [longest]


def rollouts(lengths: list[int], vocab: int) -> Any:
    """Rollouts in the dock's layout (prompt ``PROMPT``, responses padded to the longest) with GRPO's columns."""
    import torch
    from tensordict import TensorDict

    gen = torch.Generator().manual_seed(1)
    rows, width = len(lengths), max(lengths)
    ids = torch.randint(0, vocab, (rows, PROMPT + width), generator=gen)
    mask = torch.ones_like(ids)
    for row, length in enumerate(lengths):
        mask[row, PROMPT + length :] = 0
    batch = TensorDict({"input_ids": ids, "attention_mask": mask, "responses": ids[:, PROMPT:].clone(),
                        "response_mask": mask[:, PROMPT:].clone(), "advantages": torch.randn(rows, generator=gen)},
                       batch_size=[rows])
    batch["old_log_prob"] = torch.zeros(rows, width)
    return batch


def whole_logits_log_probs(model: Any, ids: Any, mask: Any, width: int, pack: bool | None = None) -> Any:
    """The engine's response function before issue 41: the whole logits at the response positions."""
    import torch

    from dockflow.engines.logprobs import TokenOutputs, position_ids_from_mask

    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                   logits_to_keep=width + 1).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, -width:, None]).squeeze(-1)
    return TokenOutputs(logp)


def engine_for(way: str, model: Any, budget: int) -> Any:
    """A ``TorchTrainingEngine`` set up as ``way`` says (the padded ways never pack)."""
    from dockflow.engines.torch_training import TorchTrainingEngine

    class PaddedEngine(TorchTrainingEngine):
        def _agree(self, pack: bool) -> bool:
            return False

    kind = TorchTrainingEngine if way == "tokens+packing" else PaddedEngine
    return kind(model, lr=1e-5, response_fn=whole_logits_log_probs if way == "before" else None,
                max_tokens_per_micro_batch=budget if way.startswith("tokens") else None)


def long_tail_case(case: dict[str, Any]) -> dict[str, Any]:
    """One update of the long-tailed batch, ``case["way"]``."""
    from benchmarks.scale import thin_qwen2
    from dockflow.config import Config

    lengths = long_tail_lengths(case["rows"], case["longest"])
    batch = rollouts(lengths, case["vocab"])
    if case["way"].startswith("tokens"):  # the actor sorts each mini-batch by length (train.seqlen_balance)
        batch = batch[sorted(range(len(lengths)), key=lengths.__getitem__)]
    engine = engine_for(case["way"], thin_qwen2(case["vocab"], hidden=128), case["budget"])
    cfg = Config(algorithm={"name": "grpo"})
    before = memory_mb()["rss_mb"]
    start = time.perf_counter()
    metrics = engine.train_mini_batch(batch, lambda lp, m, t: recipe_of(cfg.algorithm.name).policy_loss(cfg, lp, m, t), 4)
    seconds = time.perf_counter() - start
    tokens = int(batch["response_mask"].sum())
    return {**case, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1),
            "peak_growth_mb": round(memory_mb()["peak_rss_mb"] - before, 1),
            "padding_fraction": round(metrics["train/padding_fraction"], 3), "response_tokens": tokens}


def lengths_case(case: dict[str, Any]) -> dict[str, Any]:
    """One engine-level iteration with ``case["width"]`` response tokens: sample, old log-probs, update."""
    import torch

    from benchmarks.scale import thin_qwen2
    from dockflow.config import Config
    from dockflow.engines.torch_training import TorchTrainingEngine

    rows, width, vocab = case["rows"], case["width"], case["vocab"]
    model = thin_qwen2(vocab)
    train = TorchTrainingEngine(model, lr=1e-5)
    prompts = torch.randint(0, vocab, (rows, PROMPT), generator=torch.Generator().manual_seed(1))
    before = memory_mb()["rss_mb"]
    times: dict[str, float] = {}
    start = time.perf_counter()
    with torch.no_grad():  # exactly ``width`` tokens: the model has no end-of-sequence token to stop a row
        ids = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, max_new_tokens=width,
                             eos_token_id=None, pad_token_id=0)
    times["generate_s"] = time.perf_counter() - start
    batch = rollouts([width] * rows, vocab)
    batch["input_ids"] = ids
    batch["responses"] = ids[:, PROMPT:].clone()
    start = time.perf_counter()
    batch["old_log_prob"] = train.infer(batch)
    times["log_probs_s"] = time.perf_counter() - start
    cfg = Config(algorithm={"name": "grpo"})
    start = time.perf_counter()
    train.train_mini_batch(batch, lambda lp, m, t: recipe_of(cfg.algorithm.name).policy_loss(cfg, lp, m, t), rows)
    times["update_s"] = time.perf_counter() - start
    return {**case, **{k: round(v, 2) for k, v in times.items()},
            "iteration_s": round(sum(times.values()), 2),
            "peak_growth_mb": round(memory_mb()["peak_rss_mb"] - before, 1)}


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """``case`` in a fresh process (its own peak memory)."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.scale_lengths", "--child", json.dumps(case)],
                         capture_output=True, text=True, timeout=3600, check=False)
    if out.returncode != 0:
        return {**case, "failed": f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def row(r: dict[str, Any]) -> str:
    """One printed line of a result."""
    if "failed" in r:
        return f"{r.get('way', r.get('width'))}: failed {r['failed']}"
    if r["part"] == "long-tail":
        return (f"{r['way']:>15} {r['seconds']:>8.1f} {r['tokens_per_s']:>9.1f} {r['peak_growth_mb']:>9.0f} "
                f"{r['padding_fraction']:>8.3f}")
    return (f"{r['width']:>6} {r['generate_s']:>9.1f} {r['log_probs_s']:>9.1f} {r['update_s']:>9.1f} "
            f"{r['iteration_s']:>9.1f} {r['peak_growth_mb']:>9.0f}")


HEADERS = {"long-tail": f"{'way':>15} {'update s':>8} {'tokens/s':>9} {'peak MiB':>9} {'padding':>8}",
           "lengths": f"{'R':>6} {'sample s':>9} {'logp s':>9} {'update s':>9} {'iter s':>9} {'peak MiB':>9}"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--part", choices=("long-tail", "lengths"), default="long-tail")
    parser.add_argument("--out", default="runs/scale_lengths.json", help="JSON results file")
    parser.add_argument("--vocab", type=int, help="default: 32,000 (long-tail), 151,936 (lengths)")
    parser.add_argument("--rows", type=int, help="default: 16 (long-tail), 4 (lengths)")
    parser.add_argument("--longest", type=int, default=4096, help="long-tail: the longest response")
    parser.add_argument("--budget", type=int, default=8192, help="long-tail: tokens per micro-batch (tokens ways)")
    parser.add_argument("--widths", default="256,512,1024,2048,4096", help="lengths: response lengths")
    args = parser.parse_args(argv)
    if args.child:
        case = json.loads(args.child)
        print(json.dumps(long_tail_case(case) if case["part"] == "long-tail" else lengths_case(case)))
        return
    if args.part == "long-tail":
        base = {"part": "long-tail", "rows": args.rows or 16, "longest": args.longest, "budget": args.budget,
                "vocab": args.vocab or 32_000}
        cases = [{**base, "way": way} for way in WAYS]
    else:
        base = {"part": "lengths", "rows": args.rows or 4, "vocab": args.vocab or 151_936}
        cases = [{**base, "width": int(w)} for w in args.widths.split(",")]
    print(HEADERS[args.part], flush=True)
    results = []
    for case in cases:
        results.append(run_case(case))
        print(row(results[-1]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, results, part=args.part)


if __name__ == "__main__":
    main()
