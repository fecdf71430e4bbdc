"""Engines: one interface for generation, one for training; ``engine.backend`` picks the backend (hf, vllm,
cost_model) and ``engine.device`` the device (cpu, cuda, npu: ``devices.py``).

``create_engines`` is the only constructor the workers call. Backends: transformers generation, or vLLM /
vLLM-Ascend (``vllm_generation.py``, imported only when chosen); plain-torch training on one process
(``train.dp: 1``), FSDP2 over the actor's data-parallel process group (``train.dp >= 2``,
``fsdp_training.py``), or megatron-core over DP x TP x PP ranks (``train.engine: megatron``,
``megatron/training.py``). MindSpeed: only its adaptor import (``megatron/cpu.py``), never run (docs/engines.md).

Names are imported lazily (PEP 562): a process that needs only the token layout (the reward worker decodes
responses) does not pay for the backends and their imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dockflow.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from dockflow.engines.create import create_critic_engine, create_engines, create_generation_engine
    from dockflow.engines.devices import DeviceError, check_worker_device
    from dockflow.engines.hf_generation import HFGenerationEngine
    from dockflow.engines.interfaces import (
        EngineInputs,
        GenerationEngine,
        LossFn,
        SamplingParams,
        TrainingEngine,
    )
    from dockflow.engines.logprobs import batched_log_probs, response_log_probs, response_values
    from dockflow.engines.token_layout import decode_responses, encode_rollouts, first_eos_mask, response_ids
    from dockflow.engines.torch_training import TorchTrainingEngine

_EXPORTS = {
    "create_critic_engine": "dockflow.engines.create",
    "create_engines": "dockflow.engines.create",
    "create_generation_engine": "dockflow.engines.create",
    "DeviceError": "dockflow.engines.devices",
    "check_worker_device": "dockflow.engines.devices",
    "HFGenerationEngine": "dockflow.engines.hf_generation",
    "EngineInputs": "dockflow.engines.interfaces",
    "GenerationEngine": "dockflow.engines.interfaces",
    "LossFn": "dockflow.engines.interfaces",
    "SamplingParams": "dockflow.engines.interfaces",
    "TrainingEngine": "dockflow.engines.interfaces",
    "batched_log_probs": "dockflow.engines.logprobs",
    "response_log_probs": "dockflow.engines.logprobs",
    "response_values": "dockflow.engines.logprobs",
    "decode_responses": "dockflow.engines.token_layout",
    "encode_rollouts": "dockflow.engines.token_layout",
    "first_eos_mask": "dockflow.engines.token_layout",
    "response_ids": "dockflow.engines.token_layout",
    "TorchTrainingEngine": "dockflow.engines.torch_training",
}


__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "DeviceError",
    "EngineInputs",
    "GenerationEngine",
    "HFGenerationEngine",
    "LossFn",
    "SamplingParams",
    "TorchTrainingEngine",
    "TrainingEngine",
    "batched_log_probs",
    "check_worker_device",
    "create_critic_engine",
    "create_engines",
    "create_generation_engine",
    "decode_responses",
    "encode_rollouts",
    "first_eos_mask",
    "response_ids",
    "response_log_probs",
    "response_values",
]
