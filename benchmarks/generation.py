"""Generation on CPU, the HF engine vs the vLLM engine (vLLM's CPU build), side by side in one run.

Both engines get the same workload: ``--prompts`` seeded arithmetic prompts ("What is 47 + 12?\\nAnswer: "),
``--samples`` responses each, ``--new-tokens`` at most, temperature 1, the same seed, on two models built
here with random weights (nothing is downloaded): "demo", the demo's tiny Qwen2 (hidden 128, 4 layers, ~1M
parameters), and "large", a Qwen2 of hidden 512 and 8 layers on the same tokenizer (~25M, >= 20x the demo).

Reported per model and engine: ``s_per_call`` (median over ``--repeats`` calls after one uncounted warm-up),
``gen_tps`` (generated response tokens, EOS included, per second), ``total_tps`` (prompt + response tokens per
second), ``build_s`` (vLLM: building the engine and loading the weights, once; importing vllm is timed apart),
``speedup`` (gen tokens/s over the HF engine's on the same model) and ``greedy_agreement`` (share of prompts
whose greedy responses are identical in both engines: a sanity column; random weights have near-ties, so it
need not be 1).

Per model both engines are up at once and their timed calls alternate (HF, vLLM, HF, ...), so load from other
processes that comes and goes falls on both alike; each record keeps the 1-minute load average around its calls.
Threads: ``--threads`` is set with ``torch.set_num_threads`` before the first vLLM engine starts (vLLM's CPU
worker then replaces ``torch.set_num_threads`` with a no-op). vLLM runs in this process (tensor parallel 1),
where its CPU worker binds no OpenMP threads of its own (that is its multiprocess executor's job) and computes
on torch's threads like the HF engine; each record keeps the count. Timings are not asserted anywhere.

Usage: ``python -m benchmarks.generation --out generation.json [--quick] [--models demo,large] [--prompts 128]
[--samples 8] [--new-tokens 8] [--repeats 3] [--threads 2] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # read when vllm is first imported

import torch  # noqa: E402
import transformers  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.results_file import write_results  # noqa: E402
from dockflow.config import Config  # noqa: E402
from dockflow.engines import EngineInputs, HFGenerationEngine, SamplingParams  # noqa: E402

MODELS = ("demo", "large")
ENGINES = ("hf", "vllm")
LARGE = {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
         "intermediate_size": 1536, "max_position_embeddings": 256}
VLLM_SETTINGS = {"enforce_eager": True, "kv_cache_memory_gb": 1.0, "max_model_len": 128}
QUICK = {"models": "demo", "prompts": 16, "samples": 2, "repeats": 1}


@dataclass(frozen=True)
class Call:
    """One timed generate call: wall seconds, generated response tokens, prompt + response tokens."""

    seconds: float
    gen_tokens: int
    total_tokens: int


def arithmetic_prompts(count: int, seed: int) -> list[str]:
    """``count`` seeded prompts like "What is 47 + 12?\\nAnswer: "."""
    rng = random.Random(seed)
    return [f"What is {rng.randrange(100)} {rng.choice('+-')} {rng.randrange(100)}?\nAnswer: " for _ in range(count)]


def param_count(model: nn.Module) -> int:
    """Parameters of ``model`` (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def build_model(name: str, tokenizer: Any) -> nn.Module:
    """The demo's tiny Qwen2, or the large Qwen2 on the same tokenizer; random weights, seed 0."""
    from dockflow.models import build_tiny_model

    if name == "demo":
        return build_tiny_model(Config().model.tiny, tokenizer, seed=0).eval()
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    config = transformers.Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=True, dtype="float32",
                                      **LARGE, **ids)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    for key, value in ids.items():
        setattr(model.generation_config, key, value)
    return model


def timed_call(engine: Any, prompts: list[str], params: SamplingParams, seed: int) -> Call:
    """One generate call, timed; tokens counted from its masks."""
    started = time.perf_counter()
    out = engine.generate(prompts, params, seed=seed)
    seconds = time.perf_counter() - started
    return Call(seconds, int(out["response_mask"].sum()), int(out["attention_mask"].sum()))


def measure(engines: dict[str, Any], prompts: list[str], params: SamplingParams, seed: int,
            repeats: int) -> dict[str, list[Call]]:
    """One uncounted warm-up call per engine, then ``repeats`` rounds of one timed call per engine, alternating,
    so that load from other processes that comes and goes falls on every engine alike."""
    for engine in engines.values():
        engine.generate(prompts, params, seed=seed)
    calls: dict[str, list[Call]] = {name: [] for name in engines}
    for _ in range(repeats):
        for name, engine in engines.items():
            calls[name].append(timed_call(engine, prompts, params, seed))
    return calls


def greedy_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """Share of rows of two [B, R] response tensors that are identical."""
    return float((a == b).all(-1).float().mean())


def summarize(model: str, engine: str, params: int, build_s: float | None, calls: list[Call]) -> dict[str, Any]:
    """One record from the timed calls: medians of seconds and of the per-call token rates."""
    if not calls:
        raise ValueError("no timed calls")
    return {
        "model": model, "engine": engine, "params": params,
        "build_s": None if build_s is None else round(build_s, 3),
        "s_per_call": round(statistics.median(c.seconds for c in calls), 4),
        "gen_tps": round(statistics.median(c.gen_tokens / c.seconds for c in calls), 1),
        "total_tps": round(statistics.median(c.total_tokens / c.seconds for c in calls), 1),
        "gen_tokens": calls[-1].gen_tokens, "total_tokens": calls[-1].total_tokens,
        "s_per_call_all": [round(c.seconds, 4) for c in calls], "repeats": len(calls),
    }


def add_speedups(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Set ``speedup`` on every record: its gen tokens/s over the HF engine's on the same model (None without one)."""
    hf = {r["model"]: r["gen_tps"] for r in records if r["engine"] == "hf"}
    for r in records:
        base = hf.get(r["model"])
        r["speedup"] = round(r["gen_tps"] / base, 2) if base else None
    return records


def _cell(value: Any, fmt: str) -> str:
    """``value`` formatted, or "-" for None."""
    return "-" if value is None else format(value, fmt)


def table_rows(records: list[dict[str, Any]]) -> list[list[str]]:
    """The printed table's cells, one row per (model, engine)."""
    return [[r["model"], r["engine"], f"{r['params'] / 1e6:.2f}M", _cell(r["build_s"], ".1f"),
             f"{r['s_per_call']:.3f}", f"{r['gen_tps']:.0f}", f"{r['total_tps']:.0f}", _cell(r.get("speedup"), ".2f"),
             _cell(r.get("greedy_agreement"), ".3f")] for r in records]


HEADER = ["model", "engine", "params", "build s", "s/call", "gen tok/s", "total tok/s", "speed-up", "greedy agree"]


def print_table(records: list[dict[str, Any]]) -> None:
    """The table: one row per (model, engine)."""
    rows = table_rows(records)
    widths = [max(len(x) for x in column) for column in zip(HEADER, *rows, strict=True)]

    def line(cells: list[str]) -> str:  # model and engine left-aligned, numbers right-aligned
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    print(line(HEADER))
    print("-" * len(line(HEADER)))
    for row in rows:
        print(line(row))


def run_model(name: str, model: nn.Module, tokenizer: Any, workload: dict[str, int]) -> list[dict[str, Any]]:
    """Both engines on one model (the vLLM engine built, measured alongside the HF one, dropped): HF and vLLM
    records, the vLLM one with the greedy agreement."""
    from dockflow.engines.vllm_generation import VLLMGenerationEngine

    seed = workload["seed"]
    prompts = arithmetic_prompts(workload["prompts"], seed)
    params = SamplingParams(max_new_tokens=workload["new_tokens"], temperature=1.0, n=workload["samples"])
    greedy = SamplingParams(max_new_tokens=workload["new_tokens"], greedy=True)
    cfg = Config(engine={"backend": "vllm", "device": "cpu", "vllm": VLLM_SETTINGS}, run={"seed": seed})
    inputs = EngineInputs(cfg.engine, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed)
    hf = HFGenerationEngine(model, tokenizer, device="cpu", batch_size=256)
    started = time.perf_counter()
    vllm = VLLMGenerationEngine(model, tokenizer, inputs, colocated=False)
    build_s = time.perf_counter() - started
    load = os.getloadavg()[0]
    calls = measure({"hf": hf, "vllm": vllm}, prompts, params, seed, workload["repeats"])
    responses = {e: engine.generate(prompts, greedy, seed=seed)["responses"]
                 for e, engine in (("hf", hf), ("vllm", vllm))}
    records = [summarize(name, engine, param_count(model), build_s if engine == "vllm" else None, calls[engine])
               for engine in ENGINES]
    for record in records:
        record["torch_threads"] = torch.get_num_threads()
        record["load_avg_1m"] = [round(load, 2), round(os.getloadavg()[0], 2)]  # before and after the timed calls
    records[1]["greedy_agreement"] = round(greedy_agreement(responses["hf"], responses["vllm"]), 4)
    print(f"{name}: vllm built in {build_s:.1f} s; s/call hf {records[0]['s_per_call']:.3f}, "
          f"vllm {records[1]['s_per_call']:.3f}", file=sys.stderr, flush=True)
    del vllm
    gc.collect()
    return records


def run(models: list[str], workload: dict[str, int], threads: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every model through both engines: records (HF, vLLM per model, with speed-ups), and the run's facts for
    the JSON's machine block (parameter counts, seconds to import vllm)."""
    from dockflow.models import build_char_tokenizer

    torch.set_num_threads(threads)  # before the first vLLM engine, which makes set_num_threads a no-op
    tokenizer = build_char_tokenizer()
    built = {name: build_model(name, tokenizer) for name in models}
    sizes: dict[str, Any] = {name: param_count(m) for name, m in built.items()}
    if {"demo", "large"} <= set(sizes):
        sizes["large_over_demo"] = round(sizes["large"] / sizes["demo"], 2)
    print("parameters: " + ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}x" for k, v in sizes.items()),
          flush=True)
    started = time.perf_counter()
    from vllm import LLM  # noqa: F401 - imported once here, so that no engine's build_s includes it

    import_s = round(time.perf_counter() - started, 2)
    records = [r for name, model in built.items() for r in run_model(name, model, tokenizer, workload)]
    return add_speedups(records), {"params": sizes, "vllm_import_s": import_s}


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run, write the JSON, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--quick", action="store_true", help="smoke run: demo only, 16 prompts, 2 samples, 1 repeat")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--prompts", type=int, default=128, help="arithmetic prompts per call")
    parser.add_argument("--samples", type=int, default=8, help="responses per prompt (SamplingParams.n)")
    parser.add_argument("--new-tokens", type=int, default=8, help="max new tokens per response")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per model and engine (median)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (set before either engine runs)")
    parser.add_argument("--seed", type=int, default=0, help="prompts' and sampling seed")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = set(models) - set(MODELS)
    if unknown or not models:
        parser.error(f"--models: unknown {sorted(unknown)}; choose from {', '.join(MODELS)}")
    workload = {"prompts": args.prompts, "samples": args.samples, "new_tokens": args.new_tokens,
                "repeats": args.repeats, "seed": args.seed}
    started = time.perf_counter()
    records, facts = run(models, workload, args.threads)
    import vllm

    write_results(args.out, records, command=" ".join([os.path.basename(sys.executable), "-m", "benchmarks.generation",
                                                       *(sys.argv[1:] if argv is None else argv)]),
                  date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                  torch=torch.__version__, vllm=vllm.__version__, transformers=transformers.__version__,
                  device="cpu", threads=args.threads, workload=workload, quick=args.quick, **facts,
                  vllm_engine={**VLLM_SETTINGS, "in_process": True, "tensor_parallel_size": 1},
                  threads_note="torch.set_num_threads(threads) before the first vLLM engine starts (its CPU worker "
                  "then makes torch.set_num_threads a no-op). vLLM's CPU backend binds its own OpenMP threads only in "
                  "its multiprocess executor; here it runs in process (tensor parallel 1) and computes on torch's "
                  "threads, as the HF engine does: torch_threads per record.",
                  order_note="per model: HF and vLLM calls alternate (warm-up each, then repeats rounds of one "
                  "call each); load_avg_1m per record: 1-minute load average before and after the timed calls",
                  speedup_note="vLLM gen tokens/s over HF gen tokens/s on the same model",
                  wall_s=round(time.perf_counter() - started, 1))
    print_table(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
