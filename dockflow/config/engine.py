"""The ``engine:`` section: which backend generates and trains, on which device, and the backends' own settings
(``docs/engines.md``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dockflow.config.base import Section


class CostModelConfig(Section):
    prefill_s_per_token: float = Field(2e-5, ge=0.0, description="Seconds per prompt token per CPU (prefill).")
    decode_s_per_step: float = Field(0.02, ge=0.0, description="Seconds per decoding step of a chunk (its longest response sets the steps).")
    length_mu: float = Field(3.0, description="Mean of log(response length): lognormal response lengths.")
    length_sigma: float = Field(0.8, ge=0.0, description="Std of log(response length); larger: a longer tail.")
    infer_s_per_token: float = Field(2e-5, ge=0.0, description="Seconds per token per CPU of a log-prob forward.")
    train_s_per_token: float = Field(6e-5, ge=0.0, description="Seconds per token per CPU of forward + backward.")


class VLLMConfig(Section):
    """engine.backend: vllm (docs/engines.md): an in-process vLLM (its CPU build, CUDA) or vLLM-Ascend (NPU) per
    generating worker."""

    tensor_parallel_size: int = Field(
        1, ge=1, description="Tensor-parallel ranks of each vLLM engine (the generation layout's TP); every actor "
        "rank and generator worker asks Ray for this many devices, and training uses the first."
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0.0, le=1.0, description="Fraction of each device's memory vLLM may take (weights, activations, KV "
        "cache); colocated, the rest is the update's."
    )
    enforce_eager: bool = Field(False, description="true: no CUDA/NPU graphs (starts faster, decodes slower).")
    enable_prefix_caching: bool = Field(
        True, description="Reuse the KV cache of a prompt across its group's N responses (reset after each sync)."
    )
    block_size: int | None = Field(
        None, ge=1, description="Tokens per KV-cache block, the unit of prefix caching; null: vLLM's default for the "
        "device (16 on cuda, 128 on cpu)."
    )
    max_model_len: int | None = Field(
        None, ge=1, description="Longest prompt + response vLLM handles; null = the model's max_position_embeddings."
    )
    sleep_level: Literal[0, 1, 2] | None = Field(
        None, description="Colocated actor: while training runs vLLM sleeps, freeing its KV cache and 1: offloading "
        "its weights to host memory, 2: dropping them (the next weight sync reloads them); 0: never sleeps. null: "
        "2 on cuda/npu, 0 on cpu (vLLM's CPU backend has no sleep mode)."
    )
    kv_cache_memory_gb: float | None = Field(
        None, gt=0.0, description="KV cache size per vLLM engine in GiB (vLLM's kv_cache_memory_bytes); null: on "
        "cuda/npu vLLM sizes it from gpu_memory_utilization, on cpu 1 GiB (vLLM's CPU backend would reserve "
        "gpu_memory_utilization of the host's memory for every engine)."
    )
    weight_bucket_mb: float = Field(
        256.0, gt=0.0, description="Size of one bucket of full tensors streamed into vLLM per weight sync (MiB)."
    )


# Numerical noise between two correct engines on the same weights: float32 kernels agree to ~1e-5, half
# precision ones to ~1e-2 (bf16 has 8 bits of mantissa).
DEFAULT_SYNC_TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 5e-2}


class SyncCheckConfig(Section):
    """After a weight sync the generation engine scores fixed probe sequences and compares its log-probs with
    the trainer's; past the tolerance the run stops naming the sync (dockflow/engines/sync_check.py)."""

    every: int = Field(1, ge=0, description="Check every N-th weight sync of each generating worker; 0: never.")
    sequences: int = Field(4, ge=1, description="Probe sequences (random token ids, the same every sync).")
    length: int = Field(16, ge=2, description="Tokens per probe sequence.")
    tolerance: float | None = Field(
        None, gt=0.0, description="Largest allowed absolute log-prob difference; null: 1e-3 for float32 models, "
        "5e-2 for bfloat16 / float16 (numerical noise between two correct engines)."
    )


class EngineConfig(Section):
    backend: Literal["hf", "vllm", "cost_model"] = Field(
        "hf",
        description="hf: transformers generation and torch training (the real model); vllm: vLLM generation "
        "(its CPU build on cpu, vLLM on cuda, vLLM-Ascend on npu) and torch training; cost_model: modelled durations and "
        "random responses, to measure the scheduler itself (dockflow/engines/cost_model.py).",
    )
    device: Literal["cpu", "cuda", "npu"] = Field(
        "cpu",
        description="Device of the model workers (actor, generators, reference, critic): cpu, cuda (NVIDIA GPU: "
        "Ray resource GPU, nccl) or npu (Ascend: torch_npu, Ray resource NPU, hccl). Checked before the first "
        "iteration, on the cluster and in each worker.",
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    sync_check: SyncCheckConfig = Field(default_factory=SyncCheckConfig)
    cost_model: CostModelConfig = Field(default_factory=CostModelConfig)


def sleep_level(engine: EngineConfig) -> int:
    """``engine.vllm.sleep_level`` with its default resolved: 0 on cpu (no sleep mode there), else 2."""
    level = engine.vllm.sleep_level
    return level if level is not None else (0 if engine.device == "cpu" else 2)


def kv_cache_gb(engine: EngineConfig) -> float | None:
    """``engine.vllm.kv_cache_memory_gb`` with its default resolved: 1 GiB on cpu, vLLM's sizing elsewhere."""
    size = engine.vllm.kv_cache_memory_gb
    return size if size is not None else (1.0 if engine.device == "cpu" else None)


def sync_tolerance(engine: EngineConfig, dtype: str) -> float:
    """``engine.sync_check.tolerance`` with its default for the model's dtype resolved."""
    tol = engine.sync_check.tolerance
    return tol if tol is not None else DEFAULT_SYNC_TOLERANCE.get(dtype, DEFAULT_SYNC_TOLERANCE["bfloat16"])
