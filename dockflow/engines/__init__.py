"""Engines: one interface for generation, one for training; ``engine.backend`` picks the backend (hf, vllm,
cost_model) and ``engine.device`` the device (cpu, cuda, npu: ``devices.py``).

``create_engines`` is the only constructor the workers call. Backends: transformers generation, or vLLM /
vLLM-Ascend (``vllm_generation.py``, imported only when chosen); plain-torch training on one process
(``train.dp: 1``) or FSDP2 over the actor's data-parallel process group (``train.dp >= 2``,
``fsdp_training.py``). MindSpeed is not built (see docs/engines.md).
"""

from __future__ import annotations

from torch import nn

from dockflow.engines.base import GenerationEngine, LossFn, SamplingParams, TrainingEngine
from dockflow.engines.devices import DeviceError, check_worker_device
from dockflow.engines.hf_generation import HFGenerationEngine
from dockflow.engines.logprobs import batched_log_probs, response_log_probs, response_values
from dockflow.engines.rollout_layout import decode_responses, encode_rollouts, first_eos_mask
from dockflow.engines.torch_training import TorchTrainingEngine

__all__ = [
    "DeviceError",
    "GenerationEngine",
    "HFGenerationEngine",
    "LossFn",
    "SamplingParams",
    "TorchTrainingEngine",
    "TrainingEngine",
    "batched_log_probs",
    "check_worker_device",
    "create_engines",
    "create_generation_engine",
    "create_critic_engine",
    "decode_responses",
    "encode_rollouts",
    "first_eos_mask",
    "response_log_probs",
    "response_values",
]


def create_engines(
    cfg, model: nn.Module, tokenizer, device: str | None = None, cpus: float = 1.0
) -> tuple[TrainingEngine, GenerationEngine]:
    """Training and generation engines over one policy module (colocated: HF generation shares its weights, vLLM
    holds its own copy and sleeps while training runs). ``device``: None = ``engine.device``, checked here (the
    worker-side device check); ``cpus``: what the worker reserved (the cost model divides its work by it)."""
    if device is None:
        device = str(check_worker_device(cfg.engine.device, cfg.engine.backend))
    if cfg.engine.backend == "cost_model":
        from dockflow.engines.cost_model import CostModelTraining

        return CostModelTraining(cfg.engine.cost_model, cpus, model), create_generation_engine(cfg, model, tokenizer, device, cpus)
    tc = cfg.train
    common = dict(lr=tc.lr, weight_decay=tc.weight_decay, grad_clip=tc.grad_clip, infer_batch_size=tc.infer_batch_size,
                  temperature=cfg.rollout.temperature, device=device)
    if tc.dp > 1:  # FSDP2 over the actor's DP group; generation on a plain copy filled by allgather-swap
        from dockflow.engines.fsdp_training import FSDPTrainingEngine

        train: TrainingEngine = FSDPTrainingEngine(model, bucket_bytes=int(tc.reshard_bucket_mb * 2**20), **common)
        gen_model = train.generation_model
    else:
        train = TorchTrainingEngine(model, **common)
        gen_model = model
    if cfg.engine.backend == "vllm":
        from dockflow.engines.vllm_generation import ColocatedTraining, VLLMGenerationEngine

        vllm_engine = VLLMGenerationEngine(gen_model, tokenizer, cfg, colocated=True)
        return ColocatedTraining(train, vllm_engine), vllm_engine
    return train, create_generation_engine(cfg, gen_model, tokenizer, device)


def create_generation_engine(
    cfg, model: nn.Module, tokenizer, device: str | None = None, cpus: float = 1.0
) -> GenerationEngine:
    """The generation engine over ``model`` (the actor's own module when colocated, a generator's copy else).
    ``device``: None = ``engine.device``, checked here."""
    if device is None:
        device = str(check_worker_device(cfg.engine.device, cfg.engine.backend))
    if cfg.engine.backend == "cost_model":
        from dockflow.engines.cost_model import CostModelGeneration

        return CostModelGeneration(tokenizer, cfg.engine.cost_model, cfg.rollout.batch_size, cpus)
    if cfg.engine.backend == "vllm":
        from dockflow.engines.vllm_generation import VLLMGenerationEngine

        return VLLMGenerationEngine(model, tokenizer, cfg, colocated=False)
    return HFGenerationEngine(model.to(device), tokenizer, device=device, batch_size=cfg.rollout.batch_size)


def create_critic_engine(cfg, model: nn.Module, device: str | None = None) -> TrainingEngine:
    """Training engine of a critic: the same trainer, with the value head's outputs instead of log-probs.
    ``device``: None = ``engine.device``, checked here."""
    if device is None:
        device = str(check_worker_device(cfg.engine.device))
    return TorchTrainingEngine(
        model,
        lr=cfg.algorithm.ppo.critic_lr,
        weight_decay=cfg.train.weight_decay,
        grad_clip=cfg.train.grad_clip,
        infer_batch_size=cfg.train.infer_batch_size,
        device=device,
        response_fn=response_values,
    )
