"""``model.lora`` on vLLM: each weight sync sends the adapter alone (``VLLMGenerationEngine.load_weights``).

vLLM starts with ``enable_lora=True``, ``max_lora_rank`` (the rank, rounded up to a rank vLLM compiles for) and
``max_loras=1``; the base model's weights load once, through the same layerwise reload as a full sync. Each sync then
hands the adapter's tensors, in memory under PEFT's saved names, to vLLM's ``LoRAModel.from_lora_tensors`` in every
worker (``vllm_worker.LoRAAdapterWorker.load_adapter``) under a new adapter id, and every request of the engine
(generate, sample, the sync probe, tool-loop turns) names that id in its ``LoRARequest``: the probe of the sync
check therefore scores the new adapter. A new id also keys the prefix cache anew.

Fallback, with one log line saying why: the merged weights (``W + alpha / r * B A``, computed here from the adapter
and the base weights the engine was built from) through the full sync, as without LoRA. It is taken when this vLLM
build has no LoRA, the architecture has no LoRA layers in vLLM, the rank is above vLLM's largest (512), or a target
module is not one of vLLM's LoRA layers of the model (Qwen2: q/k/v packed as ``qkv_proj``, gate/up as
``gate_up_proj``, o_proj, down_proj: all seven decoder projections are covered).

``vllm`` is imported inside functions only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from dockflow.config.sections import LoraConfig
from dockflow.engines.lora import adapter_tensors, base_weights, merge_adapters
from dockflow.engines.sync_check import WeightSyncError

log = logging.getLogger(__name__)

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks
IN_MEMORY = "dockflow:in-memory-adapter"  # the LoRARequest's path: vLLM holds the adapter already, never reads it


def max_lora_rank(rank: int) -> int | None:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``; None above its largest."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), None)


def peft_config(lora: LoraConfig) -> dict[str, Any]:
    """The adapter's config as PEFT's ``adapter_config.json`` says it (what vLLM's ``PEFTHelper`` reads)."""
    return {"r": lora.rank, "lora_alpha": lora.alpha, "target_modules": list(lora.target_modules), "bias": "none"}


def lora_unsupported(lora: LoraConfig, architecture: str) -> str | None:
    """Why vLLM cannot take ``lora``'s adapter for ``architecture`` (checked before it starts), or None."""
    if max_lora_rank(lora.rank) is None:
        return f"model.lora.rank={lora.rank} is above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]})"
    try:
        from vllm.lora.request import LoRARequest  # noqa: F401
        from vllm.model_executor.models import ModelRegistry
        from vllm.model_executor.models.interfaces import supports_lora

        model_cls = ModelRegistry._try_load_model_cls(architecture)
    except Exception as err:  # noqa: BLE001  any failure here means: no adapter sync with this build
        return f"this vLLM build has no usable LoRA support ({type(err).__name__}: {err})"
    if model_cls is None or not supports_lora(model_cls):
        return f"vLLM has no LoRA layers for {architecture}"
    return None


class AdapterSync:
    """The LoRA side of one ``VLLMGenerationEngine``: which sync it runs (``adapter``, or ``merged`` as the
    fallback), the adapter vLLM holds and the ``LoRARequest`` that names it."""

    def __init__(self, lora: LoraConfig, model: nn.Module, why_merged: str | None) -> None:
        """``model``: the policy the engine is built from (a PEFT model, or the plain base model of a generator):
        where the base weights come from for the first load, and for every merged sync; ``why_merged``: None for
        the adapter sync, else why the merged one (:meth:`start` asks vLLM)."""
        self.lora, self.model, self.why_merged = lora, model, why_merged
        self.config = peft_config(lora)
        self.scaling = lora.alpha / lora.rank
        self.adapter_id = 0  # 0: no adapter loaded yet (the base model generates)

    @classmethod
    def start(cls, lora: LoraConfig, model: nn.Module) -> AdapterSync:
        """The adapter sync for ``model``, or the merged one where vLLM cannot take its adapter."""
        architectures = getattr(model.config, "architectures", None) or [type(_plain(model)).__name__]
        return cls(lora, model, lora_unsupported(lora, architectures[0]))

    @property
    def merged(self) -> bool:
        return self.why_merged is not None

    def engine_kwargs(self) -> dict[str, Any]:
        """``vllm.LLM`` arguments for the adapter sync (none for the merged fallback)."""
        if self.merged:
            return {}
        return {"enable_lora": True, "max_lora_rank": max_lora_rank(self.lora.rank), "max_loras": 1,
                "max_cpu_loras": 1}

    def check_targets(self, rpc: Any) -> None:
        """After vLLM started: fall back to the merged sync when its LoRA layers miss a target (``rpc``: the
        engine's worker call)."""
        if not self.merged:
            missing = {t for report in rpc("lora_targets_missing", "the LoRA check", list(self.lora.target_modules))
                       for t in (report if report is not None else ["(no LoRA manager)"])}
            if missing:
                self.why_merged = f"vLLM's LoRA layers of this model do not cover {', '.join(sorted(missing))}"
        if self.merged:
            log.warning("model.lora on vLLM: weight syncs send the merged weights, not the adapter alone: %s",
                        self.why_merged)
        else:
            log.info("model.lora on vLLM: weight syncs send the adapter alone (rank %d)", self.lora.rank)

    def lora_request(self) -> Any:
        """The ``LoRARequest`` every request of the engine passes (None before an adapter or when merged)."""
        if self.merged or not self.adapter_id:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(f"dockflow-policy-{self.adapter_id}", self.adapter_id, lora_path=IN_MEMORY)

    def full_weights(self, weights: Iterable[tuple[str, torch.Tensor]], base: bool) -> tuple[
            Iterator[tuple[str, torch.Tensor]] | None, dict[str, torch.Tensor]]:
        """Split a sync's ``weights`` (a PEFT model's, or an adapter alone): (what the full sync must load, or None,
        the adapter). ``base``: the base must be (re)loaded (the first load; weights vLLM dropped asleep)."""
        adapters = adapter_tensors(weights)  # consumes the stream: a sharded trainer has gathered its copy by now
        if self.merged:
            return merge_adapters(base_weights(self.model), adapters, self.scaling), adapters
        return (base_weights(self.model) if base else None), adapters

    def load(self, rpc: Any, adapters: dict[str, torch.Tensor], label: str, first: bool) -> int:
        """The adapter as the one vLLM holds, under a new id; returns the bytes vLLM took. ``first``: the initial
        load, which a generator's plain model makes without an adapter (the base generates until the first sync)."""
        if self.merged or (first and not adapters):
            return 0
        if not adapters:
            raise WeightSyncError(f"{label}: no adapter weights (lora_A / lora_B) came with the sync, and vLLM "
                                  "takes the adapter alone under model.lora")
        self.adapter_id += 1
        # copies: vLLM scales lora_B by alpha / r in place (LoRALayerWeights.optimize), and in process (TP 1) it
        # would otherwise hold the trainer's own tensors
        tensors = {name: t.detach().clone(memory_format=torch.contiguous_format) for name, t in adapters.items()}
        return int(max(rpc("load_adapter", label, self.adapter_id, tensors, self.config)))


def _plain(model: nn.Module) -> nn.Module:
    """The HF model under a PEFT wrapper (the model itself when plain)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model
