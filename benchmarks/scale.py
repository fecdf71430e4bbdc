"""Memory and time of response log-probs and of one policy-loss update at a real vocabulary, side by side in one run.

A thin Qwen2 (hidden 64, 2 layers) with Qwen2.5's vocabulary (151,936), fp32, ``B`` rows of a 16-token prompt and
``R`` response tokens. Three ways to get the response tokens' log-probs:

- ``chunked``: DockFlow's ``response_log_probs`` (the lm_head a chunk of tokens at a time from the last hidden
  state, forward and backward: ``dockflow/engines/token_head.py``);
- ``whole``: the path it replaced: the model's logits at the response positions, ``log_softmax``, ``gather``;
- ``trl``: TRL 1.16's: the same logits, then ``trl.trainer.utils.selective_log_softmax`` (a logsumexp per row).

Each case runs in a fresh process; its peak memory growth is the process's peak resident memory (``VmHWM``) after
the case minus its resident memory before (the model and the batch built), reported in MiB and as a multiple of the
full fp32 logits ``B x R x V x 4`` bytes. ``logprobs`` runs without gradients; ``update`` is the forward pass with
gradients, a GRPO-style loss ``-mean(advantage * logp)``, and its backward pass. A case whose whole logits would not
fit in ``--max-logits-gib`` is reported as skipped, not run.

Usage: ``python -m benchmarks.scale --out runs/scale.json [--shapes 4x512,16x2048] [--chunk 512]``;
``python -m benchmarks.scale --save-model DIR`` writes the model for a run at the real vocabulary (docs/engines.md).
Nothing is asserted; ``tests/unit/benchmarks/test_scale_bench.py`` runs a small shape.
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
from dockflow.engines.token_head import DEFAULT_CHUNK

VOCAB = 151_936
PROMPT = 16
PATHS = ("chunked", "whole", "trl")
MODES = ("logprobs", "update")


def thin_qwen2(vocab: int, hidden: int = 64):
    """The thin Qwen2 (2 layers, ``hidden`` wide) with ``vocab`` tokens and fixed weights."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192)
    return Qwen2ForCausalLM(config).float()


def save_model(path: str, vocab: int) -> None:
    """The thin Qwen2 with ``vocab`` tokens and the character tokenizer, as an HF directory for ``model.path``:
    ids the tokenizer lacks decode to nothing, so a run samples over the whole vocabulary (real-vocabulary memory)
    and its texts are the characters among them."""
    from dockflow.models import build_char_tokenizer, save_pretrained_dir

    tokenizer = build_char_tokenizer()
    model = thin_qwen2(vocab)
    model.config.pad_token_id, model.config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    model.config.bos_token_id = tokenizer.bos_token_id
    save_pretrained_dir(model, tokenizer, path)


def log_probs(path: str, model, ids, mask, width: int, chunk: int):
    """The response tokens' log-probs [B, R] by ``path``."""
    import torch

    from dockflow.engines.logprobs import position_ids_from_mask, response_log_probs

    if path == "chunked":
        return response_log_probs(model, ids, mask, width, chunk=chunk).values
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                   logits_to_keep=width + 1).logits[:, :-1]
    targets = ids[:, -width:]
    if path == "trl":
        from trl.trainer.utils import selective_log_softmax

        return selective_log_softmax(logits, targets)
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def child(case: dict[str, Any]) -> dict[str, Any]:
    """One case in this (fresh) process: its peak memory growth and seconds."""
    import torch

    torch.manual_seed(1)
    rows, width, vocab = case["rows"], case["width"], case["vocab"]
    model = thin_qwen2(vocab)
    ids = torch.randint(0, vocab, (rows, PROMPT + width))
    mask = torch.ones_like(ids)
    advantages = torch.randn(rows, 1)
    before = memory_mb()["rss_mb"]
    start = time.perf_counter()
    if case["mode"] == "logprobs":
        model.eval()
        with torch.no_grad():
            log_probs(case["path"], model, ids, mask, width, case["chunk"])
    else:
        model.train()
        logp = log_probs(case["path"], model, ids, mask, width, case["chunk"])
        (-(advantages * logp).mean()).backward()
    seconds = time.perf_counter() - start
    peak = memory_mb()["peak_rss_mb"] - before
    logits_mb = rows * width * vocab * 4 / 2**20
    return {**case, "peak_growth_mb": round(peak, 1), "logits_mb": round(logits_mb, 1),
            "x_logits": round(peak / logits_mb, 3), "seconds": round(seconds, 3),
            "us_per_token": round(seconds / (rows * width) * 1e6, 2)}


def run_case(case: dict[str, Any], max_logits_gib: float) -> dict[str, Any]:
    """``case`` in a fresh process, or skipped when its whole logits would not fit the limit."""
    logits_gib = case["rows"] * case["width"] * case["vocab"] * 4 / 2**30
    if case["path"] != "chunked" and logits_gib > max_logits_gib:
        return {**case, "skipped": f"whole logits {logits_gib:.1f} GiB > --max-logits-gib {max_logits_gib}"}
    out = subprocess.run([sys.executable, "-m", "benchmarks.scale", "--child", json.dumps(case)],
                         capture_output=True, text=True, timeout=1800, check=False)
    if out.returncode != 0:
        return {**case, "skipped": f"failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(results: list[dict[str, Any]]) -> str:
    """One row per case: shape, mode, path, peak growth (MiB and x the fp32 logits), microseconds per token."""
    lines = [f"{'B x R':>10} {'mode':>9} {'path':>8} {'peak MiB':>9} {'x logits':>9} {'us/token':>9}"]
    for r in results:
        shape = f"{r['rows']}x{r['width']}"
        if "skipped" in r:
            lines.append(f"{shape:>10} {r['mode']:>9} {r['path']:>8}  skipped: {r['skipped']}")
        else:
            lines.append(f"{shape:>10} {r['mode']:>9} {r['path']:>8} {r['peak_growth_mb']:>9.0f} "
                         f"{r['x_logits']:>9.3f} {r['us_per_token']:>9.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="runs/scale.json", help="JSON results file")
    parser.add_argument("--shapes", default="4x512,4x1024,16x2048", help="comma-separated B x R")
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="tokens per lm_head matmul (chunked path)")
    parser.add_argument("--save-model", help="write the thin real-vocabulary Qwen2 to this directory and stop")
    parser.add_argument("--max-logits-gib", type=float, default=4.0, help="skip whole-logits cases above this")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.save_model:
        save_model(args.save_model, args.vocab)
        return
    results = []
    for shape in args.shapes.split(","):
        rows, width = (int(x) for x in shape.split("x"))
        for mode in MODES:
            for path in PATHS:
                case = {"rows": rows, "width": width, "vocab": args.vocab, "mode": mode, "path": path,
                        "chunk": args.chunk}
                results.append(run_case(case, args.max_logits_gib))
                print(table(results[-1:]).splitlines()[-1], flush=True)
    print(table(results))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, results, model="thin Qwen2 (hidden 64, 2 layers), fp32", vocab=args.vocab)


if __name__ == "__main__":
    main()
