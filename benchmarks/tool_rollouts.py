"""Tool rollouts with tools of varied latency: each trajectory at its own pace on vLLM (``turn_stream``) against
batch-a-turn (every trajectory's turn sampled together, then every tool call of the round one after another) on
the HF engine and on vLLM, side by side in one run on the same model, prompts and tools.

The model is a tiny Qwen2 (hidden 64, 2 layers) that learned, here, in seconds, four scripted conversations of
three ``lookup`` calls and an answer (``tests/fixtures/tool_model.py``: the suite's tool model); each row is one
of them, ``--rows`` rows per rollout batch, greedy. Every ``lookup`` call sleeps a uniform random time in
[0, ``--max-latency-ms``] (0: no sleep), in the tool's own child process, as a search or a sandbox would.

Reported per latency and mode: ``s_per_batch`` (median wall seconds of one rollout batch over ``--repeats``, after
one uncounted warm-up), ``model_tps`` (model tokens per second), ``tool_calls`` per batch, and ``speedup`` (the
HF batch-a-turn's seconds over this mode's). Modes alternate within each repeat, so load from other processes
falls on all alike. Timings are not asserted anywhere.

Usage: ``python -m benchmarks.tool_rollouts --out tool_rollouts.json [--rows 32] [--latencies-ms 0,500]
[--repeats 3] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # read when vllm is first imported

import torch  # noqa: E402

from benchmarks.results_file import write_results  # noqa: E402
from dockflow.agents import ToolSpec, run_rollouts  # noqa: E402
from dockflow.config import Config  # noqa: E402
from dockflow.config.tools import ToolsConfig  # noqa: E402
from dockflow.engines import EngineInputs, HFGenerationEngine, SamplingParams  # noqa: E402
from dockflow.engines.turn_sampler import BatchSampler, turn_sampler  # noqa: E402
from tests.fixtures.tool_model import Script, conversations, learn_conversations, tool_tokenizer  # noqa: E402

MAX_LATENCY_S = 0.0  # set before the rollouts start; each ToolHost child forks with it
KEYS = ("alpha", "beta", "gamma", "delta", "omega", "sigma")
R = 320  # response width: three calls, their results and the answer


def lookup(key: str) -> int:
    """Look a key up in a slow store.

    Args:
        key: The key to look up.
    """
    if MAX_LATENCY_S > 0:
        time.sleep(random.uniform(0.0, MAX_LATENCY_S))
    return len(key) * 7


def _call(key: str) -> str:
    return f'<tool_call>{{"name": "lookup", "arguments": {{"key": "{key}"}}}}</tool_call>'


def scripts() -> list[Script]:
    """Four conversations: three lookups, then the sum of what they returned."""
    out = []
    for i in range(4):
        keys = [KEYS[(i + j) % len(KEYS)] for j in range(3)]
        row = {"prompt": [{"role": "user", "content": f"Sum {' '.join(keys)}."}], "answer": ""}
        out.append(Script(row, [*map(_call, keys), f"It is {sum(len(k) * 7 for k in keys)}."]))
    return out


def _engines(model: Any, tok: Any) -> dict[str, Any]:
    from dockflow.engines.vllm_generation import VLLMGenerationEngine

    settings = {"enforce_eager": True, "kv_cache_memory_gb": 0.5, "max_model_len": 512, "block_size": 32}
    cfg = Config(engine={"backend": "vllm", "device": "cpu", "vllm": settings})
    inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed)
    return {"hf": HFGenerationEngine(model, tok, device="cpu"), "vllm": VLLMGenerationEngine(model, tok, inputs, False)}


def one_batch(mode: str, engines: dict[str, Any], tok: Any, rows: list[dict], spec: ToolSpec) -> dict[str, float]:
    """One rollout batch in ``mode`` (``hf_batch``, ``vllm_batch`` or ``vllm_stream``): seconds, tokens, calls."""
    params = SamplingParams(max_new_tokens=R, greedy=True)
    engine = engines[mode.split("_")[0]]
    sampler = turn_sampler(engine, tok, params, 0) if mode == "vllm_stream" else BatchSampler(engine, tok, params, 0)
    start = time.perf_counter()
    outs = run_rollouts(rows, sampler, tok, spec.tools, None, spec.limits)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "model_tokens": sum(o.trajectory.metrics.model_tokens for o in outs),
            "tool_calls": sum(o.trajectory.metrics.tool_calls for o in outs),
            "answered": sum(o.trajectory.answer.startswith("It is") for o in outs) / len(outs)}


def main(argv: list[str] | None = None) -> int:
    global MAX_LATENCY_S
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tool_rollouts.json")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--latencies-ms", default="0,500")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tok = tool_tokenizer()
    spec = ToolSpec([lookup], None, ToolsConfig(max_turns=5, max_tool_calls=4, max_total_tokens=1024, timeout_s=5.0))
    script_list = scripts()
    model = learn_conversations(tok, conversations(tok, script_list, [lookup], None))
    engines = _engines(model, tok)
    rows = [script_list[k % len(script_list)].row for k in range(args.rows)]
    modes = ("hf_batch", "vllm_batch", "vllm_stream")
    results = []
    for latency_ms in [int(x) for x in args.latencies_ms.split(",")]:
        MAX_LATENCY_S = latency_ms / 1000
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
        for repeat in range(args.repeats + 1):
            for mode in modes:
                out = one_batch(mode, engines, tok, rows, spec)
                if repeat:  # the first round warms every engine up
                    runs[mode].append(out)
        base = statistics.median(r["seconds"] for r in runs["hf_batch"])
        for mode in modes:
            s = statistics.median(r["seconds"] for r in runs[mode])
            tokens = statistics.median(r["model_tokens"] for r in runs[mode])
            results.append({"max_latency_ms": latency_ms, "mode": mode, "rows": args.rows, "s_per_batch": round(s, 3),
                            "model_tps": round(tokens / s, 1), "tool_calls": runs[mode][0]["tool_calls"],
                            "answered": runs[mode][0]["answered"], "speedup": round(base / s, 2),
                            "load_1m": round(os.getloadavg()[0], 2)})
    print(f"{'latency':>8} {'mode':>12} {'s/batch':>8} {'model tok/s':>12} {'calls':>6} {'answered':>9} {'speedup':>8}")
    for r in results:
        print(f"{r['max_latency_ms']:>6}ms {r['mode']:>12} {r['s_per_batch']:>8} {r['model_tps']:>12} "
              f"{r['tool_calls']:>6} {r['answered']:>9.2f} {r['speedup']:>8}")
    write_results(args.out, results, torch=torch.__version__, threads=args.threads,
                  command="python -m benchmarks.tool_rollouts " + " ".join(argv if argv is not None else sys.argv[1:]),
                  date=datetime.date.today().isoformat())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
