"""LoRA (``model.lora``, rank 16) against full fine-tuning, side by side in one run, on the 25M-parameter Qwen2 of
benchmarks/vs_trl.py's ``larger`` setup (hidden 512, 8 layers, the task tokenizer), or with ``--model 135m`` on a
135M one (hidden 1024, 12 layers), where the weights' training state outweighs the activations.

Each variant's phases run in a fresh spawned process, so one process's memory is one model worker's:

- ``train``: the actor as a colocated run builds it (``create_engines``: the torch engine, HF generation on the
  policy), one rollout of G x N samples, then ``--steps`` GRPO steps on it. Peak memory is the process's peak
  resident set (Linux ``VmHWM``, ``dockflow.workers.peak_memory``: on CPU torch's allocator keeps no statistics, so
  RSS is what the worker costs): ``peak_rss_mb``, and ``peak_model_mb``, the same less the RSS the process had
  after its imports (Python, torch, transformers: the same in both variants); ``peak_generate_mb`` /
  ``peak_train_mb``: the peak of the rollout and of the train steps alone (less the same). ``model_state_bytes``:
  weights, gradients of what trains and AdamW's state (``optimizer_state_bytes``), exactly. ``train_step_s``: the mean of the steps after the first. Then the HF generator sync of
  a disaggregated run (``ActorWorker.publish_weights`` -> a generator's plain model): merged weights for LoRA,
  the weights for full fine-tuning; bytes and seconds. (Colocated HF generation samples with the policy: no sync.)
- ``vllm``: vLLM's CPU build (``VLLMGenerationEngine``) on the same model: ``--syncs`` syncs, each after a change
  of what trains (the adapters, or every weight), their bytes (``sync_bytes``) and seconds, the sync check's
  difference, and the seconds of one G x N generation (LoRA adds the adapter kernels).

    python -m benchmarks.lora --out benchmarks/results/lora.json [--rank 16] [--steps 4] [--syncs 3]
        [--micro-batch 32] [--no-vllm] [--gradient-checkpointing] [--model 25m|135m]

Prints a table and writes ``{"machine": ..., "results": [one record per variant], "ratios": {...}}``, the ratios
being LoRA / full with the goals (sync bytes <= 5% at rank 16, peak actor memory <= 0.6x).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.results_file import machine_info

SETUP = ("sft.enabled=false", "rollout.prompts_per_iter=8", "rollout.group_size=4", "rollout.max_new_tokens=64",
         "rollout.batch_size=32", "train.mini_batch_size=32", "train.micro_batch_size=32", "train.infer_batch_size=32",
         "train.lr=1e-5", "train.old_log_prob=rollout", "ray.torch_threads=2")
VLLM = {"enforce_eager": True, "kv_cache_memory_gb": 0.5, "max_model_len": 256}
GOAL_SYNC, GOAL_MEMORY = 0.05, 0.6
# --model: vs_trl's 25M Qwen2 (its LARGER_MODEL), or 135M parameters (hidden 1024, 12 layers, GQA 16/4), where the
# weights' training state (16 bytes a parameter with AdamW in fp32) outweighs the activations, as in a real model
MODELS = {"25m": {}, "135m": {"hidden_size": 1024, "num_layers": 12, "num_heads": 16, "num_kv_heads": 4,
                              "intermediate_size": 2816, "max_position_embeddings": 512}}


def config(variant: str, rank: int, extra: tuple[str, ...] = ()) -> Any:
    """The demo config with the larger setup and ``extra`` overrides; ``lora`` sets model.lora at ``rank`` (alpha
    2 x rank, every projection)."""
    from dockflow.config import load_config

    lora = [f"model.lora={{rank: {rank}, alpha: {2.0 * rank}}}"] if variant == "lora" else []
    return load_config("configs/grpo_arith.yaml", [*SETUP, *lora, *extra])


def larger_model(cfg: Any, size: str) -> tuple[Any, Any]:
    """The ``size`` Qwen2 of ``MODELS`` (fresh weights) and the task tokenizer."""
    from benchmarks.vs_trl import LARGER_MODEL
    from dockflow.config import TinyModelConfig
    from dockflow.models import build_tiny_model
    from dockflow.models.tokenizer import build_task_tokenizer

    shape = LARGER_MODEL if size == "25m" else TinyModelConfig(**MODELS[size])
    tokenizer = build_task_tokenizer(cfg.data, cfg.run.seed, cfg.model.tiny.tokenizer_merges, cfg.checkpoint)
    return build_tiny_model(shape, tokenizer, seed=cfg.run.seed), tokenizer


def nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def train_phase(variant: str, rank: int, steps: int, micro: int, extra: tuple[str, ...], size: str) -> dict[str, Any]:
    """One actor's memory, optimizer state and train steps (micro-batches of ``micro`` rows; ``extra`` overrides,
    e.g. activation checkpointing), then the HF generator sync (a spawned process)."""
    import torch

    from benchmarks.engine_rounds import Engines
    from dockflow.algos import recipe_of
    from dockflow.engines import HFGenerationEngine
    from dockflow.engines.lora import is_lora, merged_weights
    from dockflow.workers.peak_memory import host_peak_mb

    torch.set_num_threads(2)
    cfg = config(variant, rank, extra)
    base_rss = host_peak_mb() or 0.0
    model, tok = larger_model(cfg, size)
    params = sum(p.numel() for p in model.parameters())
    rounds = Engines(cfg, model, tok, threads=2)  # create_engines, with model.lora when set
    start = time.perf_counter()
    batch = rounds.generate(0)
    gen_s = time.perf_counter() - start
    peak_generate = host_peak_mb() or 0.0  # since the imports; the next reading: the train steps' alone
    n = cfg.rollout.group_size
    rows, width = batch["responses"].shape
    times = []
    for k in range(steps):  # engine_rounds.Engines.update's GRPO step, in micro-batches of ``micro`` rows
        advantages = torch.randn(rows // n, generator=torch.Generator().manual_seed(k)).repeat_interleave(n)
        step = batch.clone()
        step["advantages"] = advantages[:, None].expand(rows, width) * step["response_mask"]
        start = time.perf_counter()
        rounds.train.train_mini_batch(step, lambda logp, mb, tokens: recipe_of("grpo").policy_loss(cfg, logp, mb,
                                                                                                   tokens), micro)
        times.append(time.perf_counter() - start)
    peak_train = host_peak_mb() or 0.0
    peak = max(peak_generate, peak_train)
    optimizer = rounds.train.optimizer
    state = nbytes(t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    policy = rounds.train.policy_module()
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    generator = HFGenerationEngine(larger_model(cfg, size)[0], tok)  # a disaggregated generator's plain model
    start = time.perf_counter()
    synced = dict(merged_weights(policy) if is_lora(policy) else rounds.train.named_weights())
    generator.load_weights(iter(synced.items()))
    hf_sync_s = time.perf_counter() - start
    weights = nbytes(p for p in policy.parameters())
    grads = nbytes(p for p in policy.parameters() if p.requires_grad)
    return {"variant": variant, "params": params, "trainable_params": trainable, "micro_batch": micro,
            "peak_rss_mb": peak, "peak_model_mb": peak - base_rss, "rss_after_imports_mb": base_rss,
            "peak_generate_mb": peak_generate - base_rss, "peak_train_mb": peak_train - base_rss,
            "model_state_bytes": weights + grads + state, "optimizer_state_bytes": state,
            "train_step_s": sum(times[1:]) / max(1, len(times) - 1), "train_steps_s": times,
            "hf_generate_s": gen_s, "hf_sync_bytes": nbytes(synced.values()), "hf_sync_s": hf_sync_s}


def vllm_phase(variant: str, rank: int, syncs: int, size: str) -> dict[str, Any]:
    """vLLM's syncs and one generation on the variant's policy (a spawned process)."""
    import torch

    from dockflow.config import load_config
    from dockflow.engines import EngineInputs, SamplingParams
    from dockflow.engines.lora import with_lora
    from dockflow.engines.sync_check import SyncChecker
    from dockflow.engines.vllm_generation import VLLMGenerationEngine

    cfg = config(variant, rank)
    vllm_cfg = load_config("configs/grpo_arith.yaml", [*SETUP, "engine.backend=vllm"]).engine
    vllm_cfg.vllm = vllm_cfg.vllm.model_copy(update=VLLM)
    model, tok = larger_model(cfg, size)
    policy = with_lora(model, cfg.model.lora, seed=0) if cfg.model.lora else model
    inputs = EngineInputs(vllm_cfg, cfg.train, cfg.rollout, cfg.model.dtype, cfg.run.seed, cfg.model.lora)
    start = time.perf_counter()
    engine = VLLMGenerationEngine(policy, tok, inputs, colocated=False)
    start_s = time.perf_counter() - start
    checker = SyncChecker(every=1, sequences=4, length=32, tolerance=1e-3, seed=0)
    gen = torch.Generator().manual_seed(1)
    seconds, sent, diffs = [], [], []
    for _ in range(syncs):
        with torch.no_grad():  # a step's change of what trains
            for p in policy.parameters():
                if p.requires_grad:
                    p.add_(1e-3 * torch.randn(p.shape, generator=gen))
        start = time.perf_counter()
        engine.load_weights(iter(list(policy.named_parameters())))
        seconds.append(time.perf_counter() - start)
        sent.append(engine.sync_bytes)
        diffs.append(engine.check_sync(checker.next_probe(policy, len(tok))))
    prompts = [f"What is {a} + {a + 7}?\nAnswer: " for a in range(cfg.rollout.prompts_per_iter)]
    params = SamplingParams(cfg.rollout.max_new_tokens, 1.0, 1.0, greedy=False, n=cfg.rollout.group_size)
    start = time.perf_counter()
    engine.generate(prompts, params, seed=0)
    return {"variant": variant, "vllm_sync": "merged" if engine.adapters and engine.adapters.merged else
            ("adapter" if engine.adapters else "full"), "vllm_start_s": start_s, "vllm_sync_bytes": sent[-1],
            "vllm_sync_s": sum(seconds) / len(seconds), "vllm_syncs_s": seconds, "vllm_sync_check_max": max(diffs),
            "vllm_generate_s": time.perf_counter() - start}


def in_process(fn: Any, *args: Any) -> dict[str, Any]:
    """``fn(*args)`` in a fresh spawned process (its own peak memory, its own vLLM)."""
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/lora.json")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--micro-batch", type=int, default=32, help="rows per micro-batch of the train steps (of 32)")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM phase")
    parser.add_argument("--model", choices=sorted(MODELS), default="25m", help="the policy's size (MODELS)")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="both variants recompute activations (train.gradient_checkpointing=true)")
    args = parser.parse_args(argv)
    extra = ("train.gradient_checkpointing=true",) if args.gradient_checkpointing else ()
    results = []
    for variant in ("full", "lora"):
        record = in_process(train_phase, variant, args.rank, args.steps, args.micro_batch, extra, args.model)
        if not args.no_vllm:
            record.update(in_process(vllm_phase, variant, args.rank, args.syncs, args.model))
        record["rank"] = args.rank if variant == "lora" else None
        record["gradient_checkpointing"] = args.gradient_checkpointing
        record["model"] = args.model
        results.append(record)
        print(f"{variant}: done", flush=True)
    full, lora = results
    keys = ("peak_rss_mb", "peak_model_mb", "peak_generate_mb", "peak_train_mb", "model_state_bytes",
            "optimizer_state_bytes", "train_step_s", "hf_sync_bytes", "hf_sync_s",
            "vllm_sync_bytes", "vllm_sync_s", "vllm_generate_s")
    ratios = {k: lora[k] / full[k] for k in keys if k in full and full[k]}
    ratios["goal_sync_bytes"] = f"vllm_sync_bytes <= {GOAL_SYNC}"
    ratios["goal_peak_memory"] = f"peak_model_mb <= {GOAL_MEMORY}"
    ratios["met"] = {"sync_bytes": ratios.get("vllm_sync_bytes", 1.0) <= GOAL_SYNC,
                     "peak_memory": ratios["peak_model_mb"] <= GOAL_MEMORY}
    print(f"{'':24}{'full':>14}{'lora r' + str(args.rank):>14}{'lora/full':>11}")
    for k in keys:
        if k in full:
            print(f"{k:24}{full[k]:>14.4g}{lora[k]:>14.4g}{ratios.get(k, float('nan')):>11.3f}")
    import torch

    machine = machine_info(torch=torch.__version__, threads=2, omp_num_threads=os.environ.get("OMP_NUM_THREADS"))
    command = " ".join(["python -m benchmarks.lora", *(argv if argv is not None else sys.argv[1:])])
    Path(args.out).write_text(json.dumps({"machine": machine, "command": command, "results": results,
                                          "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
