"""LoRA's in-place adapter add (``engines/lora_inplace.py``): PEFT's values and gradients bit for bit, with two
fewer output-sized temporaries per adapted layer."""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.tiny_models import tiny_qwen2
from peft.tuners.lora.layer import Linear
from torch import nn
from torch.profiler import ProfilerActivity, profile

from dockflow.config import LoraConfig
from dockflow.engines.lora import adapter_off, with_lora
from dockflow.engines.lora_inplace import InPlaceLoraLinear


def lora_model(dropout: float) -> nn.Module:
    """The tiny Qwen2 with adapters on every projection, B drawn away from PEFT's zeros."""
    model = with_lora(tiny_qwen2(40), LoraConfig(rank=4, alpha=8.0, dropout=dropout), seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    return model


def as_peft(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose adapted layers run PEFT's own forward."""
    peft = copy.deepcopy(model)
    for module in peft.modules():
        if isinstance(module, InPlaceLoraLinear):
            module.__class__ = Linear
    return peft


def loss_and_grads(model: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A weighted sum of the logits (dropout drawn from seed 3) and the adapters' gradients."""
    model.train()
    torch.manual_seed(3)
    logits = model(input_ids=ids).logits
    loss = (logits * torch.linspace(-1.0, 1.0, logits.shape[-1])).sum()
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_the_in_place_forward_gives_peft_s_loss_and_gradients_bit_for_bit(dropout: float):
    model = lora_model(dropout)
    assert sum(isinstance(m, InPlaceLoraLinear) for m in model.modules()) == 2 * 7  # 2 layers x 7 projections
    peft = as_peft(model)
    ids = torch.randint(0, 40, (3, 11), generator=torch.Generator().manual_seed(2))
    loss, grads = loss_and_grads(model, ids)
    expected_loss, expected = loss_and_grads(peft, ids)
    assert torch.equal(loss, expected_loss)
    assert grads.keys() == expected.keys()
    assert all(torch.equal(grads[n], expected[n]) for n in grads)
    with torch.no_grad(), adapter_off(model), adapter_off(peft):  # the reference: the base model, unchanged
        model.eval(), peft.eval()
        assert torch.equal(model(input_ids=ids).logits, peft(input_ids=ids).logits)


def allocated_outputs(layer: nn.Module, x: torch.Tensor) -> float:
    """The bytes the layer's forward (with autograd) allocates, in units of its output's size."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        layer(x)
    allocated = sum(max(0, e.self_cpu_memory_usage) for e in prof.events() if e.name != "[memory]")
    return allocated / (x.shape[0] * layer.out_features * x.element_size())


def test_an_adapted_layer_allocates_two_output_sized_buffers_where_peft_allocates_four():
    """The base output and lora_B's (plus lora_A's, rank-sized): the scaled adapter output and the sum go into them,
    where PEFT makes both anew."""
    model = lora_model(0.0)
    layer = model.base_model.model.model.layers[0].mlp.down_proj  # 48 -> 32, rank 4
    x = torch.randn(256, layer.in_features, requires_grad=True)
    assert 2.0 <= allocated_outputs(layer, x) < 2.5
    layer.__class__ = Linear
    assert 4.0 <= allocated_outputs(layer, x) < 4.5
