"""The engines' constructors: ``create_engines`` (a worker's training and generation engines over one policy),
``create_generation_engine`` (a generator's) and ``create_critic_engine`` (a critic's). The backends are imported
only when chosen (vLLM, FSDP2, megatron-core, the cost model)."""

from __future__ import annotations

from typing import Any

from torch import nn

from dockflow.config.algorithm import CriticSection
from dockflow.engines.devices import check_worker_device
from dockflow.engines.hf_generation import HFGenerationEngine
from dockflow.engines.interfaces import EngineInputs, GenerationEngine, TrainingEngine
from dockflow.engines.logprobs import response_values
from dockflow.engines.torch_training import TorchTrainingEngine


def create_engines(
    inputs: EngineInputs, model: nn.Module, tokenizer: Any, device: str | None = None, cpus: float = 1.0
) -> tuple[TrainingEngine, GenerationEngine]:
    """Training and generation engines over one policy module (colocated: HF generation shares its weights, vLLM
    holds its own copy and sleeps while training runs); with ``inputs.lora`` the policy is PEFT's LoRA model over
    ``model`` (only the adapters train). ``device``: None = ``engine.device``, checked here (the
    worker-side device check); ``cpus``: what the worker reserved (the cost model divides its work by it)."""
    ec = inputs.engine
    if device is None:
        device = str(check_worker_device(ec.device, ec.backend))
    if ec.backend == "cost_model":
        from dockflow.engines.cost_model import CostModelTraining

        gen = create_generation_engine(inputs, model, tokenizer, device, cpus)
        return CostModelTraining(ec.cost_model, cpus, model), gen
    tc = inputs.train
    if inputs.lora is not None:  # the policy's adapters (the config refuses megatron): PEFT wraps it before sharding
        from dockflow.engines.lora import with_lora

        model = with_lora(model, inputs.lora, inputs.seed)
    common = dict(lr=tc.lr, weight_decay=tc.weight_decay, grad_clip=tc.grad_clip, infer_batch_size=tc.infer_batch_size,
                  temperature=inputs.rollout.temperature, device=device,
                  gradient_checkpointing=tc.gradient_checkpointing)
    budget = dict(max_tokens_per_micro_batch=tc.max_tokens_per_micro_batch)
    replay = tc.router_replay == "replay"  # an MoE policy's recorded experts in its forward (engines/routing.py)
    if tc.engine == "megatron":  # DP x TP x PP ranks of megatron-core; generation on the HF copy of the gathered weights
        from dockflow.engines.megatron.training import MegatronTrainingEngine

        train = MegatronTrainingEngine(model, tp=tc.tp, pp=tc.pp, ep=tc.ep, seed=inputs.seed,
                                       moe_aux_loss_coeff=tc.moe_aux_loss_coeff, router_replay=replay, **common,
                                       **budget)
        gen_model = train.generation_model
    elif tc.dp > 1:  # FSDP2 over the actor's DP group; generation on a plain copy filled by allgather-swap
        from dockflow.engines.fsdp_training import FSDPTrainingEngine

        train: TrainingEngine = FSDPTrainingEngine(model, bucket_bytes=int(tc.reshard_bucket_mb * 2**20), **common,
                                                   **budget, router_replay=replay)
        gen_model = train.generation_model
    else:
        train = TorchTrainingEngine(model, **common, **budget, router_replay=replay)
        gen_model = model
    if ec.backend == "vllm":
        from dockflow.engines.vllm_generation import ColocatedTraining, VLLMGenerationEngine

        vllm_engine = VLLMGenerationEngine(gen_model, tokenizer, inputs, colocated=True)
        return ColocatedTraining(train, vllm_engine), vllm_engine
    return train, create_generation_engine(inputs, gen_model, tokenizer, device)


def create_generation_engine(
    inputs: EngineInputs, model: nn.Module, tokenizer: Any, device: str | None = None, cpus: float = 1.0
) -> GenerationEngine:
    """The generation engine over ``model`` (the actor's own module when colocated, a generator's copy else).
    ``device``: None = ``engine.device``, checked here."""
    ec = inputs.engine
    if device is None:
        device = str(check_worker_device(ec.device, ec.backend))
    if ec.backend == "cost_model":
        from dockflow.engines.cost_model import CostModelGeneration

        return CostModelGeneration(tokenizer, ec.cost_model, inputs.rollout.batch_size, cpus)
    if ec.backend == "vllm":
        from dockflow.engines.vllm_generation import VLLMGenerationEngine

        return VLLMGenerationEngine(model, tokenizer, inputs, colocated=False)
    return HFGenerationEngine(model.to(device), tokenizer, device=device, batch_size=inputs.rollout.batch_size)


def create_critic_engine(
    inputs: EngineInputs, critic: CriticSection, model: nn.Module, device: str | None = None
) -> TrainingEngine:
    """Training engine of a critic: the same trainer, with the value head's outputs instead of log-probs, at the
    critic's learning rate (``critic.critic_lr``: the run plan's critic section); with ``train.engine: megatron``
    this rank's shard of a megatron value model (``MegatronCriticEngine``).
    ``device``: None = ``engine.device``, checked here."""
    if device is None:
        device = str(check_worker_device(inputs.engine.device))
    tc = inputs.train
    common = dict(lr=critic.critic_lr, weight_decay=tc.weight_decay, grad_clip=tc.grad_clip,
                  infer_batch_size=tc.infer_batch_size, device=device, gradient_checkpointing=tc.gradient_checkpointing)
    if tc.engine == "megatron":  # this rank's TP x PP shard of the value model
        from dockflow.engines.megatron.value import MegatronCriticEngine

        return MegatronCriticEngine(model, tp=tc.tp, pp=tc.pp, seed=inputs.seed, **common,
                                    max_tokens_per_micro_batch=tc.max_tokens_per_micro_batch)
    return TorchTrainingEngine(model, response_fn=response_values, **common,
                               max_tokens_per_micro_batch=tc.max_tokens_per_micro_batch)
