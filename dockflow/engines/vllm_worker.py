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


class WeightSyncWorker:
    """Methods added to vLLM's worker (``self`` is the worker: ``model_runner``, ``vllm_config``)."""

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
        expected = {name for name, _ in model.named_parameters()}
        return {"missing": sorted(expected - self._dockflow_loaded)}
