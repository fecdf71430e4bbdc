"""LoRA on the policy (``model.lora``): PEFT's adapters on a frozen base model.

    model = with_lora(model, cfg.model.lora, seed)   # a PeftModel: only the lora_A / lora_B weights train
    with adapter_off(model): ...                     # the base model: the reference policy, no weight copy
    merged_weights(model)                            # HF-named weights with each adapter merged in (generators)
    adapter_tensors(weights)                         # the adapters alone, in PEFT's saved names (vLLM's adapter sync)
    merge_adapters(base_weights(model), adapters, s) # a plain model's weights with those adapters merged in
    save_lora_model(model, path)                     # merged HF directory + ``adapter/`` in PEFT's own format

The training engines find out by ``is_lora`` and then checkpoint only what trains (``trainable_state``).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dockflow.config.sections import LoraConfig
from dockflow.reshard.rules import DEFAULT_RULES, PartitionRules

ADAPTER = "default"  # PEFT's name of the one adapter
ADAPTER_DIR = "adapter"  # beside the merged final model: the adapter in PEFT's format


class LoraError(ValueError):
    """``model.lora`` does not fit the model (a target that matches nothing, a rank above a target's size)."""


def _matches(name: str, target: str) -> bool:
    """PEFT's rule for a list of target names: the module's name or a dotted suffix of it."""
    return name == target or name.endswith(f".{target}")


def check_targets(model: nn.Module, lora: LoraConfig) -> None:
    """Raise :class:`LoraError` (one line) for a target that matches no linear layer of the decoder, targets the
    output head, or is narrower than ``lora.rank``."""
    linear = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    kinds = sorted({name.rsplit(".", 1)[-1] for name in linear})
    for target in lora.target_modules:
        hits = {name: m for name, m in linear.items() if _matches(name, target)}
        if not hits:
            raise LoraError(f"model.lora.target_modules: {target!r} matches no linear layer of the model; its linear "
                            f"layers are {', '.join(kinds)}")
        for name, module in hits.items():
            if module is head:
                raise LoraError(f"model.lora.target_modules: {target!r} matches the output head {name!r}, which the "
                                "chunked log-probs read as a plain weight; adapt the decoder's layers only")
            smaller = min(module.in_features, module.out_features)
            if lora.rank > smaller:
                raise LoraError(f"model.lora.rank={lora.rank} exceeds {name} ({module.in_features} -> "
                                f"{module.out_features}): set model.lora.rank <= {smaller} or drop {target!r} from "
                                "model.lora.target_modules")


def with_lora(model: nn.Module, lora: LoraConfig, seed: int) -> nn.Module:
    """``model`` wrapped in PEFT's LoRA (a ``PeftModel``): the base frozen, the adapters in the model's dtype,
    their initial values drawn from ``seed`` alone (every DP rank, and a resumed run, starts from the same); each
    adapted linear layer adds its adapter's output in place (``lora_inplace.py``)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    check_targets(model, lora)
    config = PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                            target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM")
    from dockflow.engines.lora_inplace import swap_in_place_forward

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # autocast off: FSDP2 gathers a unit's parameters in one dtype, so the adapters keep the model's
        peft_model = get_peft_model(model, config, autocast_adapter_dtype=False)
    swap_in_place_forward(peft_model)  # the same values with fewer temporaries (lora_inplace.py)
    return peft_model


def is_lora(model: nn.Module) -> bool:
    """Whether ``model`` is a PEFT LoRA model (also once FSDP2 has wrapped it); never imports PEFT itself."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def causal_lm(model: nn.Module) -> nn.Module:
    """The HF causal LM that runs ``model``'s forward and ``generate`` (a LoRA model's, with its adapter layers;
    hooks on the ``PeftModel`` itself would never fire, as its ``generate`` calls the inner model)."""
    return model.get_base_model() if is_lora(model) else model


def adapter_off(model: nn.Module) -> AbstractContextManager[Any]:
    """The block runs ``model`` without its adapters (the base model); a plain model as it is."""
    return model.disable_adapter() if is_lora(model) else nullcontext()


def trainable_names(model: nn.Module) -> set[str]:
    """Names of the parameters that train (a LoRA model: its adapters)."""
    return {name for name, p in model.named_parameters() if p.requires_grad}


def trainable_state(state: dict[str, torch.Tensor], names: set[str]) -> dict[str, torch.Tensor]:
    """The entries of a model ``state`` dict that belong to ``names`` (what a LoRA checkpoint keeps)."""
    return {k: v for k, v in state.items() if k in names}


def check_adapters(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Raise :class:`LoraError` unless ``state`` (a LoRA checkpoint's model part) holds every adapter of ``model``."""
    missing = trainable_names(model) - set(state)
    if missing:
        raise LoraError(f"the checkpoint lacks {len(missing)} adapter weights of model.lora (e.g. "
                        f"{sorted(missing)[0]}): it was written with other model.lora settings; resume with those")


def load_adapters(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a LoRA checkpoint's adapter weights into ``model``; every adapter must be there (the base is not)."""
    check_adapters(model, state)
    model.load_state_dict(state, strict=False)


def lora_partition_rules() -> PartitionRules:
    """The reshard's partition rules for a PEFT model: a wrapped layer's weights (``q_proj.base_layer.weight``) as
    the plain layer's, the adapters replicated (FSDP2 shards them over the DP ranks as any other; no TP here)."""
    wrapped = [(pattern.replace(r"\.weight$", r"(\.base_layer)?\.weight$").replace(r"\.bias$", r"(\.base_layer)?\.bias$")
                .replace(r"\.(weight|bias)$", r"(\.base_layer)?\.(weight|bias)$"), kind) for pattern, kind in DEFAULT_RULES]
    return PartitionRules(rules=[(r"\.lora_(A|B)\.[^.]+\.weight$", "replicated"), *wrapped])


def _base_name(name: str) -> str:
    """A PEFT parameter name as the plain HF model names it."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


@torch.no_grad()
def merged_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The plain HF model's weights (its names, its tied weights once) with every adapter merged in:
    ``W + (alpha / r) B A``, as PEFT's ``merge_and_unload`` computes it."""
    from peft.tuners.lora import LoraLayer

    deltas = {f"{name}.base_layer.weight": module.get_delta_weight(ADAPTER)
              for name, module in model.named_modules()
              if isinstance(module, LoraLayer) and ADAPTER in module.lora_A}
    for name, param in model.named_parameters():
        if ".lora_" in name:
            continue
        weight = param.detach()
        yield _base_name(name), (weight + deltas[name] if name in deltas else weight)


def base_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's weights under the plain HF model's names (a LoRA model's adapters left out; a plain model's
    weights as they are)."""
    for name, param in model.named_parameters():
        if ".lora_" not in name:
            yield _base_name(name), param.detach()


def saved_adapter_name(name: str) -> str | None:
    """An adapter weight's name as PEFT's ``save_pretrained`` writes it (``...q_proj.lora_A.weight``, the adapter's
    name dropped), from a live PEFT model's (``...q_proj.lora_A.default.weight``) or a saved one; None for a name
    that is no adapter weight."""
    for part in ("lora_A", "lora_B"):
        live, saved = f".{part}.{ADAPTER}.weight", f".{part}.weight"
        if name.endswith(live):
            return name.removesuffix(live) + saved
        if name.endswith(saved):
            return name
    return None


def adapter_tensors(weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The adapter weights of a stream of a LoRA model's weights, under PEFT's saved names (no copies); every other
    weight (the frozen base) is passed over."""
    out = {}
    for name, tensor in weights:
        saved = saved_adapter_name(name)
        if saved is not None:
            out[saved] = tensor.detach()
    return out


@torch.no_grad()
def merge_adapters(base: Iterable[tuple[str, torch.Tensor]], adapters: dict[str, torch.Tensor],
                   scaling: float) -> Iterator[tuple[str, torch.Tensor]]:
    """``base`` (plain HF names) with ``adapters`` (:func:`adapter_tensors`'s names) merged in:
    ``W + scaling B A`` for every weight an adapter targets, the others as they are."""
    for name, weight in base:
        module = f"base_model.model.{name.removesuffix('.weight')}"
        a, b = adapters.get(f"{module}.lora_A.weight"), adapters.get(f"{module}.lora_B.weight")
        if a is None or b is None or not name.endswith(".weight"):
            yield name, weight
        else:
            yield name, weight + scaling * (b.to(weight.dtype) @ a.to(weight.dtype))


def merged_model(model: nn.Module) -> nn.Module:
    """A plain HF model (a copy) with the adapters merged in; ``model`` is left as it is."""
    return copy.deepcopy(model).merge_and_unload()


def save_lora_model(model: nn.Module, path: str | Path) -> None:
    """The merged HF model at ``path`` (what loads it as a plain model), and the adapter alone in PEFT's format at
    ``path/adapter`` (adapter_config.json, adapter_model.safetensors)."""
    merged_model(model).save_pretrained(path)
    model.save_pretrained(Path(path) / ADAPTER_DIR)
