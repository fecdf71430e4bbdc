"""Runs inside each vLLM worker: the weight-sync lifecycle, mixed into vLLM's worker class by the engine argument
``worker_extension_cls`` and called by name through ``LLM.collective_rpc`` (so nothing is pickled but the
tensors, and ``tensor_parallel_size > 1`` needs no ``VLLM_ALLOW_INSECURE_SERIALIZATION``).

A sync is vLLM's layerwise reload (``vllm/model_executor/model_loader/reload/``, what its checkpoint-format weight
transfer engines run): :meth:`begin_weight_sync` puts every layer back into its checkpoint layout, each
:meth:`load_weight_bucket` feeds full Hugging Face tensors to the model's own ``load_weights`` (a layer is
post-processed, e.g. repacked into the CPU GEMM kernel, as soon as all its weights arrived, so buckets may split a
layer), and :meth:`finish_weight_sync` finalizes the rest. Two things the reload alone leaves stale are handled
here:

- a module that shares a parameter with another (the tied ``lm_head`` of ``embed_tokens``) gets no weights of
  its own, so vLLM keeps its kernel from the first load: its ``process_weights_after_loading`` is run again;
- a parameter that no bucket named keeps its old values: :meth:`finish_weight_sync` returns those names.

With ``model.lora`` (vLLM started with ``enable_lora``) a sync is the adapter alone: :meth:`load_adapter` builds
vLLM's ``LoRAModel`` from the adapter's tensors in memory (PEFT's names, no file) and makes it the one adapter
held, under the id the engine's requests then name (``dockflow.engines.vllm_lora``);
:meth:`lora_targets_missing` says which ``target_modules`` this model's LoRA layers do not cover.

Imported by vLLM (by its dotted name) in the worker process, and by the tests; ``vllm`` itself is imported only
inside the methods.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def shared_parameter_modules(model: nn.Module) -> list[nn.Module]:
    """Modules that hold a parameter object another module holds too (tied weights), in model order."""
    owners: dict[int, list[nn.Module]] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append(module)
    seen: set[int] = set()
    out = []
    for group in owners.values():
        if len(group) < 2:
            continue
        for module in group:
            if id(module) not in seen:
                seen.add(id(module))
                out.append(module)
    return out


def expected_lora_modules(supported: list[str], packed: dict[str, list[str]]) -> set[str]:
    """The module names an adapter may target in vLLM's model: its LoRA-capable layers, a packed layer by the names
    it packs (Qwen2's ``qkv_proj`` as q_proj / k_proj / v_proj), as vLLM's ``WorkerLoRAManager`` expects them."""
    out: set[str] = set()
    for module in supported:
        out.update(packed.get(module, [module]))
    return out


class LoRAAdapterWorker:
    """The adapter-sync methods added to vLLM's worker (``self`` is the worker: ``model_runner``)."""

    def lora_targets_missing(self, targets: list[str]) -> list[str] | None:
        """None when vLLM runs without LoRA; else the ``targets`` (PEFT target names) no LoRA layer covers."""
        manager = getattr(self.model_runner, "lora_manager", None)
        if manager is None:
            return None
        adapters = manager._adapter_manager
        expected = expected_lora_modules(list(adapters.supported_lora_modules), adapters.packed_modules_mapping)
        return [t for t in targets if t.rsplit(".", 1)[-1] not in expected]

    def load_adapter(self, lora_id: int, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> int:
        """Make ``tensors`` (PEFT's saved names: ``...q_proj.lora_A.weight``) with PEFT config ``config`` the one
        adapter vLLM holds, as ``lora_id``; every earlier adapter is dropped. Returns the bytes taken."""
        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.peft_helper import PEFTHelper

        manager = self.model_runner.lora_manager
        helper = PEFTHelper.from_dict({**config, "vllm_max_position_embeddings": manager.max_position_embeddings})
        helper.validate_legal(manager.lora_config)
        adapters = manager._adapter_manager
        mapper = getattr(adapters.model, "hf_to_vllm_mapper", None)
        lora = LoRAModel.from_lora_tensors(
            lora_id, tensors, helper, device="cpu", dtype=manager.lora_config.lora_dtype,
            model_vocab_size=manager.vocab_size, weights_mapper=None if mapper is None else mapper.get_rename_mapper())
        with torch.no_grad():
            adapters.remove_all_adapters()
            adapters.add_adapter(lora)
            adapters.activate_adapter(lora_id)
        return sum(t.numel() * t.element_size() for t in tensors.values())


class WeightSyncWorker(LoRAAdapterWorker):
    """Methods added to vLLM's worker (``self`` is the worker: ``model_runner``, ``vllm_config``); the adapter sync's
    from :class:`LoRAAdapterWorker`."""

    def begin_weight_sync(self) -> None:
        """Start a sync: layers back to their checkpoint layout, loaders that process each layer once it is whole."""
        from vllm.config import set_current_vllm_config

        try:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload
        except ImportError:
            import vllm

            raise RuntimeError(f"vLLM {vllm.__version__} has no layerwise reload (vllm.model_executor.model_loader."
                               "reload, in vLLM 0.25 and later), which DockFlow's weight sync runs: upgrade vllm "
                               "(or vllm-ascend)") from None
        self._dockflow_loaded: set[str] = set()
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self.model_runner.get_model())

    def load_weight_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> int:
        """Full checkpoint-named tensors into the model's loader (it slices them for this TP rank)."""
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            loaded = self.model_runner.get_model().load_weights(weights=bucket)
        self._dockflow_loaded.update(loaded or ())
        return len(bucket)

    def finish_weight_sync(self) -> dict[str, Any]:
        """Finalize the reload, rebuild tied modules' kernels; returns the parameters no bucket loaded."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        model = self.model_runner.get_model()
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            finalize_layerwise_reload(model, self.model_runner.model_config)
            for module in shared_parameter_modules(model):
                method = getattr(module, "quant_method", None)
                if method is not None:
                    method.process_weights_after_loading(module)
        # a LoRA layer holds its base layer's weights as ``<layer>.base_layer.weight``; loaders name them plainly
        expected = {name.replace(".base_layer.", ".") for name, _ in model.named_parameters()}
        return {"missing": sorted(expected - self._dockflow_loaded)}
