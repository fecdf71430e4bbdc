"""PEFT's LoRA linear layer with the adapter's output scaled and added in place: the same values and gradients,
two fewer temporaries of the layer's output size per forward.

PEFT's forward computes ``result = base(x) + lora_B(lora_A(dropout(x))) * scaling``: besides the base output and
``lora_B``'s, it makes two more tensors of the output's size (the scaled adapter output and the sum), and frees
them again. Neither is kept for backward (the base linear saves its input, ``lora_B`` its input, a scalar multiply
and an add nothing), so ``base(x).add_(lora_B(...).mul_(scaling))`` computes the same floats with the same ops
into the buffers that already exist, and autograd's version counters refuse it should anything need the
overwritten values. On CPU, where glibc's heap keeps what a train step frees, the transient volume is what
fragments it: a LoRA train step of ``benchmarks/lora.py`` (25M Qwen2, 32 rows) allocated 0.77 GiB more in its
forward than full fine-tuning's and peaked 0.4 GB higher in resident memory; in place it peaks lower than full
fine-tuning (docs/engines.md, "Measured: LoRA rank 16").

    swap_in_place_forward(peft_model)   # every vanilla LoRA ``Linear`` of it, in place
"""

from __future__ import annotations

from typing import Any

import torch
from peft.tuners.lora.layer import Linear
from torch import nn


class InPlaceLoraLinear(Linear):
    """A PEFT LoRA ``Linear`` whose plain training / inference forward adds the scaled adapter output in place;
    every other case (adapters off, merged, mixed-batch adapters, variants such as DoRA, extra arguments, an
    adapter of another dtype) runs PEFT's own forward."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        active = [a for a in self.active_adapters if a in self.lora_A]
        if args or kwargs or self.disable_adapters or self.merged or any(a in self.lora_variant for a in active):
            return super().forward(x, *args, **kwargs)
        self._check_forward_args(x)
        result = self.base_layer(x)
        for adapter in active:
            h = self._cast_input_dtype(x, self.lora_A[adapter].weight.dtype)
            delta = self.lora_B[adapter](self.lora_A[adapter](self.lora_dropout[adapter](h)))
            if delta.dtype != result.dtype:  # PEFT's type promotion, not an in-place cast
                return super().forward(x)
            result = result.add_(delta.mul_(self.scaling[adapter]))
        return result


def swap_in_place_forward(model: nn.Module) -> int:
    """Make every PEFT LoRA ``Linear`` of ``model`` (exactly that class, not a subclass) an
    :class:`InPlaceLoraLinear`; returns how many."""
    swapped = 0
    for module in model.modules():
        if type(module) is Linear:
            module.__class__ = InPlaceLoraLinear
            swapped += 1
    return swapped
