"""The ``engine:`` section: which backend generates and trains, on which device, and the backends' own settings
(``docs/engines.md``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dockflow.config_base import Section


class CostModelConfig(Section):
    prefill_s_per_token: float = Field(2e-5, ge=0.0, description="Seconds per prompt token per CPU (prefill).")
    decode_s_per_step: float = Field(0.02, ge=0.0, description="Seconds per decoding step of a chunk (its longest response sets the steps).")
    length_mu: float = Field(3.0, description="Mean of log(response length): lognormal response lengths.")
    length_sigma: float = Field(0.8, ge=0.0, description="Std of log(response length); larger: a longer tail.")
    infer_s_per_token: float = Field(2e-5, ge=0.0, description="Seconds per token per CPU of a log-prob forward.")
    train_s_per_token: float = Field(6e-5, ge=0.0, description="Seconds per token per CPU of forward + backward.")


class VLLMConfig(Section):
    """engine.backend: vllm (docs/engines.md): an in-process vLLM (CUDA) or vLLM-Ascend (NPU) per generating worker."""

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
    max_model_len: int | None = Field(
        None, ge=1, description="Longest prompt + response vLLM handles; null = the model's max_position_embeddings."
    )
    sleep_level: Literal[0, 1, 2] = Field(
        2, description="Colocated actor: while training runs vLLM sleeps, freeing its KV cache and 1: offloading "
        "its weights to host memory, 2: dropping them (the next weight sync reloads them); 0: never sleeps."
    )
    weight_bucket_mb: float = Field(
        256.0, gt=0.0, description="Size of one bucket of full tensors streamed into vLLM per weight sync (MiB)."
    )


class EngineConfig(Section):
    backend: Literal["hf", "vllm", "cost_model"] = Field(
        "hf",
        description="hf: transformers generation and torch training (the real model); vllm: vLLM / vLLM-Ascend "
        "generation and torch training (needs engine.device cuda or npu); cost_model: modelled durations and "
        "random responses, to measure the scheduler itself (dockflow/engines/cost_model.py).",
    )
    device: Literal["cpu", "cuda", "npu"] = Field(
        "cpu",
        description="Device of the model workers (actor, generators, reference, critic): cpu, cuda (NVIDIA GPU: "
        "Ray resource GPU, nccl) or npu (Ascend: torch_npu, Ray resource NPU, hccl). Checked before the first "
        "iteration, on the cluster and in each worker.",
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    cost_model: CostModelConfig = Field(default_factory=CostModelConfig)
